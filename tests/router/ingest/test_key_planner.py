"""vLLM 0.33's partial entries with partial-hash hits (full attention block 64 + mamba
align block 64, hash unit 16), through the real ingestor and scorer on both backends.

``cache_partial_block`` stores the prompt's last hash-unit boundary inside a block as a
one-unit store: ``block_size`` = the unit, ``token_ids`` = that unit's tokens, parent =
the chain hash one unit before. Starting a block, its parent is the previous block's
hash (known); further in, the parent is a unit inside the block that no event carries.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from _helpers import stored
from _kv_streams import Harness, configured_harness, tokens, wire

from router.index.base import GPU_BIT
from router.ingest.partials import waiting_partials
from schemas import BlockRemoved, BlockStored

UNIT, BLOCK = 16, 64
FULL, MAMBA = "full_attention", "mamba"


def _store(
    hashes: list[int], toks: list[int], parent: int | None, bs: int, group: int, kind: str
) -> BlockStored:
    return stored(hashes, toks, parent, block_size=bs, group=group, kind=kind)


@pytest.fixture(params=["memory", "redis"])
async def harness(request: pytest.FixtureRequest) -> AsyncIterator[Harness]:
    h = await configured_harness(request, hash_block_size=UNIT, partial_hash_hits=True)
    yield h
    await h.index.close()


async def test_partial_entries_serve_sub_block_hits(harness: Harness) -> None:
    toks = tokens(256, seed=3)
    blocks = [_store([1, 2], toks[:128], None, BLOCK, 0, FULL)]
    blocks.append(_store([2], toks[:128], None, BLOCK, 1, MAMBA))  # a state at 128 only
    # The prompt ended at 144 (unit 8, the first unit of block 2): parent = block 1.
    partial = [_store([10], toks[128:144], 2, UNIT, g, k) for g, k in ((0, FULL), (1, MAMBA))]
    await harness.ingestor.apply_batch("w", wire(*blocks))
    await harness.ingestor.apply_batch("w", wire(*partial))
    c = harness.ingestor.counters
    assert (c.unknown_parent, c.partial_unknown_prefix, c.bad_events) == (0, 0, 0)
    # vLLM: two whole blocks, then the partial entry at unit 8 (below the cap), mamba
    # state there too.
    assert (await harness.one(toks[:150], "w")).hit_tokens == 144
    # The cap (144 tokens -> 143) leaves the partial out: back to the block boundary.
    assert (await harness.one(toks[:144], "w")).hit_tokens == 128
    # The full group's partial entry gone (evicted): its whole blocks still serve 128.
    await harness.ingestor.apply_batch(
        "w", wire(BlockRemoved(block_hashes=[10], medium="GPU", group_idx=0))
    )
    assert (await harness.one(toks[:150], "w")).hit_tokens == 128


async def test_partial_inside_a_block_waits_for_its_block(harness: Harness) -> None:
    toks = tokens(256, seed=4)
    full = [_store([1, 2], toks[:128], None, BLOCK, 0, FULL)]
    full.append(_store([2], toks[:128], None, BLOCK, 1, MAMBA))
    await harness.ingestor.apply_batch("w", wire(*full))
    # The prompt ended at 176 (unit 10): its parent is unit 9, inside block 2, which no
    # event named; the tokens of units 8..9 are nowhere in the stream yet.
    partial = [_store([11], toks[160:176], 99, UNIT, g, k) for g, k in ((0, FULL), (1, MAMBA))]
    await harness.ingestor.apply_batch("w", wire(*partial))
    c = harness.ingestor.counters
    assert (c.unknown_parent, c.partial_unknown_prefix, c.partial_late) == (0, 0, 0)
    assert (await harness.one(toks[:200], "w")).hit_tokens == 128  # not guessed
    # Block 2 filled (decode): its tokens place the waiting entries in both groups.
    await harness.ingestor.apply_batch("w", wire(_store([3], toks[128:192], 2, BLOCK, 0, FULL)))
    assert (c.unknown_parent, c.partial_unknown_prefix, c.partial_late) == (0, 0, 2)
    # A request ending inside block 3: block 2 whole, then the mamba state at 176.
    assert (await harness.one(toks[:200], "w")).hit_tokens == 176


async def test_partial_removed_before_its_block_leaves_quietly(harness: Harness) -> None:
    """A waiting copy removed before its key is known was served by engine hash
    meanwhile (``router.score.partial_entries``): it leaves the table, nothing is lost."""
    toks = tokens(256, seed=5)
    await harness.ingestor.apply_batch("w", wire(_store([1, 2], toks[:128], None, BLOCK, 0, FULL)))
    partial = [_store([11], toks[160:176], 99, UNIT, g, k) for g, k in ((0, FULL), (1, MAMBA))]
    await harness.ingestor.apply_batch("w", wire(*partial))
    await harness.ingestor.apply_batch(
        "w", wire(BlockRemoved(block_hashes=[11], medium="GPU", group_idx=1))
    )
    c = harness.ingestor.counters
    assert (c.partial_unknown_prefix, c.blocks_removed_missing) == (0, 0)
    (table,) = waiting_partials(harness.index, "w")
    assert table.slots(11) == {(0, GPU_BIT): 1}


async def test_waiting_partials_keyed_once_their_parent_is(harness: Harness) -> None:
    """Prompts ending at 176, 160 and 144 (units 10, 9, 8), announced in that order:
    the first two wait for their parent, the third (starting block 2) keys them all."""
    toks = tokens(256, seed=7)
    full = [_store([1, 2], toks[:128], None, BLOCK, 0, FULL)]
    full.append(_store([2], toks[:128], None, BLOCK, 1, MAMBA))
    await harness.ingestor.apply_batch("w", wire(*full))
    for h, parent, unit in ((11, 21, 10), (21, 20, 9), (20, 2, 8)):
        part = toks[unit * UNIT : (unit + 1) * UNIT]
        batch = [_store([h], part, parent, UNIT, g, k) for g, k in ((0, FULL), (1, MAMBA))]
        await harness.ingestor.apply_batch("w", wire(*batch))
    c = harness.ingestor.counters
    assert (c.unknown_parent, c.partial_unknown_prefix, c.partial_late) == (0, 0, 4)
    assert (await harness.one(toks[:180], "w")).hit_tokens == 176
    assert (await harness.one(toks[:170], "w")).hit_tokens == 160
