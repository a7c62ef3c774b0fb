"""Waiting vLLM partial entries found at score time by the engine's own hashing
(``router.score.partial_entries``), through the real ingestor and scorer, both backends.

Shape: full attention block 64 + mamba (align) block 64, hash unit 16, partial-hash hits.
A prompt that ended at 176 tokens (unit 10, inside block 2) left a one-unit entry in
each group whose parent, the unit at 160, no event carries: ingest cannot key it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest
from _helpers import stored
from _kv_streams import Harness, configured_harness, tokens

from router.score import partial_entries
from router.score.partial_entries import EngineChains
from schemas import BlockRemoved, BlockStored
from schemas.hashing import NONE_HASH_SEED, external_hash, hash_block

UNIT, BLOCK = 16, 64
FULL, MAMBA = "full_attention", "mamba"


def engine_hashes(toks: Sequence[int], algo: str = "sha256", salt: str | None = None) -> list[int]:
    """vLLM's published unit hashes (``get_request_block_hasher`` at the unit)."""
    out, parent = [], None
    for j in range(len(toks) // UNIT):
        extra = (("cache_salt", salt),) if salt and j == 0 else None
        parent = hash_block(parent, toks[j * UNIT : (j + 1) * UNIT], extra, algo, NONE_HASH_SEED)
        out.append(external_hash(parent))
    return out


def _store(
    hashes: list[int], toks: list[int], parent: int | None, bs: int, group: int, kind: str
) -> BlockStored:
    return stored(hashes, toks, parent, block_size=bs, group=group, kind=kind)


@pytest.fixture(params=["memory", "redis"])
async def harness(request: pytest.FixtureRequest) -> AsyncIterator[Harness]:
    h = await configured_harness(request, hash_block_size=UNIT, partial_hash_hits=True)
    yield h
    await h.index.close()


async def _held(h: Harness, toks: list[int], eh: list[int], **extra: Any) -> None:
    """Blocks 0-1 in both groups (mamba: its state at 128), then the entries at unit 10."""
    first = _store([eh[3], eh[7]], toks[:128], None, BLOCK, 0, FULL)
    mamba = _store([eh[7]], toks[:128], None, BLOCK, 1, MAMBA)
    if extra:
        first.extra_keys = mamba.extra_keys = extra["extra_keys"]
    await h.feed("w", first, mamba)
    unit10 = toks[160:176]
    await h.feed(
        "w", *(_store([eh[10]], unit10, eh[9], UNIT, g, k) for g, k in ((0, FULL), (1, MAMBA)))
    )
    assert h.ingestor.counters.partial_unknown_prefix == 0


@pytest.mark.parametrize("algo", ["sha256", "sha256_cbor"])
async def test_entry_inside_a_block_is_found_by_engine_hash(harness: Harness, algo: str) -> None:
    toks = tokens(256, seed=11)
    await _held(harness, toks, engine_hashes(toks, algo))
    # vLLM: whole blocks to 128, the full group's partial entry at 176 below the cap,
    # mamba's state there too. Without the lookup: 128.
    assert (await harness.one(toks[:180], "w")).hit_tokens == 176
    # The cap (176 tokens -> 175) leaves it out.
    assert (await harness.one(toks[:176], "w")).hit_tokens == 128
    # Another unit 9 (the unit the entry chains to): another prefix, no hit.
    other = toks[:144] + [t + 1 for t in toks[144:160]] + toks[160:180]
    assert (await harness.one(other, "w")).hit_tokens == 128
    # Mamba's copy evicted: no state at 176, back to the block boundary.
    await harness.feed(
        "w", BlockRemoved(block_hashes=[engine_hashes(toks, algo)[10]], medium="GPU", group_idx=1)
    )
    assert (await harness.one(toks[:180], "w")).hit_tokens == 128


async def test_salted_requests_hash_their_salt(harness: Harness) -> None:
    toks = tokens(256, seed=12)
    eh = engine_hashes(toks, salt="s1")
    await _held(harness, toks, eh, extra_keys=[["s1"], None])
    assert (await harness.one(toks[:180], "w", cache_salt="s1")).hit_tokens == 176
    assert (await harness.one(toks[:180], "w")).hit_tokens == 0


async def test_many_workers_take_the_per_worker_path(harness: Harness) -> None:
    """Wide fleets score on the columns / bitset paths; a worker with matched entries
    is scored per worker with them."""
    toks = tokens(256, seed=13)
    await _held(harness, toks, engine_hashes(toks))
    ids = ["w"] + [f"idle{i}" for i in range(200)]
    got = await harness.score(toks[:180], ids)
    assert {w.worker_id: w.hit_tokens for w in got.workers}["w"] == 176


def test_digests_are_cached_by_the_router_key() -> None:
    """A follow-up turn hashes only its new units; the answer equals a fresh chain."""
    toks = tokens(96, seed=14)
    chains = EngineChains(cap=4)
    keys = list(range(6))
    assert chains.external("sha256", toks, UNIT, None, None, keys) == engine_hashes(toks)
    assert len(chains._cache) == 4  # bounded
    assert chains.external("sha256", toks, UNIT, None, None, keys) == engine_hashes(toks)


async def test_only_units_up_to_the_block_after_the_held_run_are_hashed(
    harness: Harness,
) -> None:
    """vLLM looks for a partial entry only inside the block after the run of whole
    blocks, so that bounds the hashing (digests cached per router key: counted here)."""
    toks = tokens(256, seed=15)
    await _held(harness, toks, engine_hashes(toks))
    cache = partial_entries._CHAINS._cache
    cache.clear()  # shared by the process: the other backend's run hashed these too
    before = 0
    fresh = tokens(256, seed=16)  # no whole block held: units 0-2 of block 0, both algos
    assert (await harness.one(fresh, "w")).hit_tokens == 0
    assert len(cache) - before == 2 * 3
    before = len(cache)
    # Blocks 0-1 held: units 0-10 (block 2 up to its last unit), sha256 matches first.
    assert (await harness.one(toks, "w")).hit_tokens == 176
    assert len(cache) - before == 11
