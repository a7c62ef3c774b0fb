"""The shapes of vLLM 0.33's stores, on memory and Redis (see conftest.py).

Built by hand from vLLM's ``BlockPool.cache_full_blocks`` / ``cache_partial_block``: one
hash chain at the hash unit for every group, sparse stores that list only kept blocks
while ``token_ids`` spans the whole range, partial entries at the unit inside a larger
block, parents that only another group announced.
"""

from __future__ import annotations

from collections.abc import Sequence

from _kv_streams import EventSource, Harness, tokens

from schemas import BlockRemoved, BlockStored

W = "w"
UNIT = 16
FULL = dict(kind="full_attention")
SWA = dict(kind="sliding_window", window=32)  # 2 blocks of 16 before a hit


def store(
    chain: Sequence[int],
    toks: Sequence[int],
    *,
    group: int,
    bs: int,
    start: int,
    stop: int,
    keep: Sequence[int] | None = None,
    kind: str,
    window: int | None = None,
) -> BlockStored:
    """Blocks ``[start, stop)`` of size ``bs`` (a multiple of the unit), keeping only
    ``keep`` (absolute block indices) as vLLM's retention masks do."""
    k = bs // UNIT
    block_hashes = [chain[(i + 1) * k - 1] for i in range(start, stop)]
    kept = range(start, stop) if keep is None else keep
    return BlockStored(
        block_hashes=[block_hashes[i - start] for i in kept],
        parent_block_hash=chain[start * k - 1] if start > 0 else None,
        token_ids=list(toks[start * bs : stop * bs]),
        block_size=bs,
        lora_id=None,
        medium="GPU",
        lora_name=None,
        group_idx=group,
        kv_cache_spec_kind=kind,
        kv_cache_spec_sliding_window=window,
    )


def setup(n_units: int) -> tuple[list[int], list[int]]:
    toks = tokens(n_units * UNIT + 1)
    return toks, EventSource().hashes(toks, UNIT)


async def test_sparse_window_store_before_the_dense_store_of_its_step(harness: Harness) -> None:
    """The SWA group (0) comes first in the batch and keeps only the two blocks before
    the end; the full group (1) names every block. Nothing is rejected."""
    toks, chain = setup(8)
    swa = store(chain, toks, group=0, bs=16, start=0, stop=8, keep=[6, 7], **SWA)
    full = store(chain, toks, group=1, bs=16, start=0, stop=8, **FULL)
    await harness.feed(W, swa, full)
    c = harness.ingestor.counters
    assert (c.bad_events, c.unknown_parent, c.unplaced_blocks, c.sparse_stores) == (0, 0, 0, 1)
    assert (await harness.one(toks, W)).hit_tokens == 128
    # A shorter prompt ends where the window has no blocks: the hit falls to 0... unless
    # its window is cached; blocks 2-3 were masked, so a 64-token hit is impossible.
    assert (await harness.one(toks[: 4 * 16 + 1], W)).hit_tokens == 0
    groups = await harness.ingestor.worker_groups(W)
    assert groups[0].blocks_by_medium == {"GPU": 2} and groups[1].blocks_by_medium == {"GPU": 8}


async def test_sparse_store_placed_against_an_earlier_batch(harness: Harness) -> None:
    toks, chain = setup(12)
    await harness.feed(W, store(chain, toks, group=0, bs=16, start=0, stop=12, **FULL))
    # A later step: the SWA group caches blocks 4..12 keeping 6-7 and 10-11 (two
    # alignment boundaries); its parent (block 3) was never announced in group 1.
    swa = store(chain, toks, group=1, bs=16, start=4, stop=12, keep=[6, 7, 10, 11], **SWA)
    await harness.feed(W, swa)
    c = harness.ingestor.counters
    assert (c.bad_events, c.unknown_parent, c.unplaced_blocks) == (0, 0, 0)
    assert (await harness.one(toks, W)).hit_tokens == 192
    assert (await harness.one(toks[: 8 * 16 + 1], W)).hit_tokens == 128
    assert (await harness.one(toks[: 10 * 16 + 1], W)).hit_tokens == 128


async def test_empty_store_is_normal(harness: Harness) -> None:
    toks, chain = setup(4)
    await harness.feed(W, store(chain, toks, group=0, bs=16, start=0, stop=4, keep=[], **SWA))
    c = harness.ingestor.counters
    assert (c.bad_events, c.unknown_parent, c.events_stored) == (0, 0, 1)


async def test_mixed_block_sizes_share_one_chain_at_the_unit(harness: Harness) -> None:
    """Full attention at 64-token blocks, a sliding window at 16: the full group names
    its block by the unit hash at the block's last unit; the SWA group's parents are
    unit hashes nobody announced."""
    toks, chain = setup(16)  # 256 tokens: 4 full blocks, 16 window blocks
    full = store(chain, toks, group=0, bs=64, start=0, stop=4, **FULL)
    swa = store(chain, toks, group=1, bs=16, start=0, stop=16, keep=[2, 3, 6, 7, 14, 15], **SWA)
    await harness.feed(W, full, swa)
    c = harness.ingestor.counters
    assert (c.bad_events, c.unknown_parent, c.unplaced_blocks, c.hash_unit_changes) == (0, 0, 0, 0)
    assert (await harness.one(toks, W)).hit_tokens == 256
    assert (await harness.one(toks[:129], W)).hit_tokens == 128
    # lcm 64: a 3-block window tail at 192 was masked (blocks 10-11): back to 128.
    assert (await harness.one(toks[:193], W)).hit_tokens == 128
    # The next step chains from unit 15 (announced by both groups' last blocks).
    more = tokens(8 * 16, seed=3)
    toks2 = toks[:256] + more + [1]
    chain2 = EventSource().hashes(toks2, UNIT)
    full2 = store(chain2, toks2, group=0, bs=64, start=4, stop=6, **FULL)
    swa2 = store(chain2, toks2, group=1, bs=16, start=16, stop=24, keep=[22, 23], **SWA)
    await harness.feed(W, swa2, full2)
    assert (c.bad_events, c.unknown_parent, c.unplaced_blocks) == (0, 0, 0)
    assert (await harness.one(toks2, W)).hit_tokens == 384


async def test_partial_entry_is_not_a_block_size_change(harness: Harness) -> None:
    """A 64-token full group stores the prompt's tail at the unit (block_size 16) and
    later promotes it: BlockRemoved of the partial hash, then the full block. Its parent
    (unit 4) is named by the window group's kept tail of the same step."""
    toks, chain = setup(8)
    full = store(chain, toks, group=0, bs=64, start=0, stop=1, **FULL)
    partial = BlockStored(
        block_hashes=[chain[5]],
        parent_block_hash=chain[4],
        token_ids=list(toks[5 * 16 : 6 * 16]),
        block_size=16,
        lora_id=None,
        medium="GPU",
        lora_name=None,
        group_idx=0,
        kv_cache_spec_kind="full_attention",
    )
    swa = store(chain, toks[: 6 * 16], group=1, bs=16, start=0, stop=6, keep=[2, 3, 4, 5], **SWA)
    await harness.feed(W, full, partial, swa)
    c = harness.ingestor.counters
    assert (c.bad_events, c.unknown_parent, c.partial_stores, c.hash_unit_changes) == (0, 0, 1, 0)
    groups = await harness.ingestor.worker_groups(W)
    assert groups[0].block_size == 64 and groups[0].blocks_by_medium == {"GPU": 2}
    assert (await harness.one(toks, W)).hit_tokens == 64  # partial hits are off by default
    promote = BlockRemoved(block_hashes=[chain[5]], medium="GPU", group_idx=0)
    swa2 = store(chain, toks, group=1, bs=16, start=6, stop=8, **SWA)
    await harness.feed(W, promote, store(chain, toks, group=0, bs=64, start=1, stop=2, **FULL))
    await harness.feed(W, swa2)
    assert (c.bad_events, c.unknown_parent) == (0, 0)
    assert (await harness.one(toks, W)).hit_tokens == 128
    assert (await harness.ingestor.worker_groups(W))[0].blocks_by_medium == {"GPU": 2}


async def test_a_smaller_block_size_later_relearns_the_unit(harness: Harness) -> None:
    """Without a registered hash_block_size the unit is learned (gcd of block sizes);
    one that shrinks voids the keys so far, counted -- never silently wrong."""
    toks, chain = setup(8)
    await harness.feed(W, store(chain, toks, group=0, bs=64, start=0, stop=2, **FULL))
    assert (await harness.one(toks, W)).hit_tokens == 128
    await harness.feed(W, store(chain, toks, group=1, bs=16, start=0, stop=8, **SWA))
    c = harness.ingestor.counters
    assert c.hash_unit_changes == 1
    assert (await harness.one(toks, W)).hit_tokens == 0  # group 0 must be re-announced
    await harness.feed(W, store(chain, toks, group=0, bs=64, start=0, stop=2, **FULL))
    assert (await harness.one(toks, W)).hit_tokens == 128


async def test_negative_group_is_rejected_on_every_backend(harness: Harness) -> None:
    """Redis' op parser once dropped the sign and wrote group -1 into group 1."""
    toks, chain = setup(4)
    await harness.feed(W, store(chain, toks, group=-1, bs=16, start=0, stop=4, **FULL))
    await harness.feed(W, store(chain, toks, group=1, bs=16, start=0, stop=4, **FULL))
    c = harness.ingestor.counters
    assert c.bad_groups == 1
    groups = await harness.ingestor.worker_groups(W)
    assert list(groups) == [1] and groups[1].blocks_by_medium == {"GPU": 4}
