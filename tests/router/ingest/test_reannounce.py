"""``kv_cache_report_mode: "full"`` re-announcements against copies (vLLM 0.33), through
the real ingestor and scorer on both backends.

A re-announcement (``emit_cached_block_events``) re-sends a hit as a chain start per
group: blocks cached already, no new copy. A recompute from 0 (``cache_full_blocks``)
has the same shape and *is* a new copy. Each test removes one copy afterwards, so a
wrong call shows in the score.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from _helpers import stored
from _kv_streams import Harness, new_index, tokens, wire

from router.index.base import EngineSettings
from schemas import BlockRemoved, BlockStored

B = 16
FULL, SWA = "full_attention", "sliding_window"


def _store(
    hashes: list[int], toks: list[int], parent: int | None, group: int = 0, kind: str = FULL
) -> BlockStored:
    window = 32 if kind == SWA else None
    return stored(hashes, toks, parent, block_size=B, group=group, kind=kind, window=window)


def _removed(hashes: list[int], group: int = 0) -> BlockRemoved:
    return BlockRemoved(block_hashes=hashes, medium="GPU", group_idx=group)


@pytest.fixture(params=["memory", "redis"])
async def harness(request: pytest.FixtureRequest) -> AsyncIterator[Harness]:
    url = request.getfixturevalue("redis_url") if request.param == "redis" else None
    h = Harness.build(new_index(request.param, url))
    await h.ingestor.configure("w", EngineSettings(report_full=True))
    yield h
    await h.index.close()


async def test_reannouncement_without_new_blocks_is_no_copy(harness: Harness) -> None:
    toks = tokens(100, seed=1)
    await harness.feed("w", _store([1, 2, 3], toks[:48], None))
    # A later request hits the three blocks and computes no new full block this step.
    await harness.feed("w", _store([1, 2, 3], toks[:48], None))
    assert harness.ingestor.counters.reannounced_blocks == 3
    await harness.feed("w", _removed([3]))  # the one copy vLLM had
    assert (await harness.one(toks, "w")).hit_tokens == 32


async def test_reannouncement_of_blocks_cached_earlier_in_the_step(harness: Harness) -> None:
    toks = tokens(100, seed=2)
    # One step: request A computes two blocks, request B (same prefix) hits them.
    await harness.feed("w", _store([1, 2], toks[:32], None), _store([1, 2], toks[:32], None))
    await harness.feed("w", _removed([2]))
    assert (await harness.one(toks, "w")).hit_tokens == 16


async def test_recompute_after_eviction_in_the_step_is_a_copy(harness: Harness) -> None:
    toks = tokens(100, seed=3)
    await harness.feed("w", _store([1, 2], toks[:32], None))
    # One step: an allocation evicts both blocks, then a request (its lookup missed)
    # computes them again from 0.
    await harness.feed("w", _removed([2]), _removed([1]), _store([1, 2], toks[:32], None))
    assert harness.ingestor.counters.reannounced_blocks == 0
    assert (await harness.one(toks, "w")).hit_tokens == 32


async def test_hybrid_recompute_when_the_window_missed_is_a_copy(harness: Harness) -> None:
    toks = tokens(100, seed=4)
    full = _store([1, 2, 3], toks[:48], None)
    await harness.feed("w", full, _store([1, 2, 3], toks[:48], None, 1, SWA))
    await harness.feed("w", _removed([3, 2, 1], 1))  # the window's blocks left
    assert (await harness.one(toks, "w")).hit_tokens == 0
    # Full attention holds the prefix, the window does not: vLLM's lookup missed and the
    # request recomputed from 0 (a copy in both groups), not a re-announcement.
    await harness.feed("w", full, _store([1, 2, 3], toks[:48], None, 1, SWA))
    assert harness.ingestor.counters.reannounced_blocks == 0
    await harness.feed("w", _removed([3]))  # the older full-attention copy
    assert (await harness.one(toks, "w")).hit_tokens == 48
    # And a hit it re-announces (the window held) is no copy in either group.
    await harness.feed("w", full, _store([1, 2, 3], toks[:48], None, 1, SWA))
    assert harness.ingestor.counters.reannounced_blocks == 6


@pytest.mark.parametrize("one_write", [False, True], ids=["batch-each", "one-write"])
async def test_reannouncement_after_one_of_two_copies_left(
    harness: Harness, one_write: bool
) -> None:
    toks = tokens(100, seed=5)
    await harness.feed("w", _store([1], toks[:16], None), _store([2], toks[16:32], 1))
    await harness.feed("w", _store([2], toks[16:32], 1))  # a resend re-caches it: 2 copies
    evict, reannounce = wire(_removed([2])), wire(_store([1, 2], toks[:32], None))
    if one_write:  # a subscriber that fell behind applies both in one write
        await harness.ingestor.apply_batches([("w", evict), ("w", reannounce)])
    else:
        await harness.ingestor.apply_batch("w", evict)
        await harness.ingestor.apply_batch("w", reannounce)
    assert harness.ingestor.counters.reannounced_blocks == 2
    await harness.feed("w", _removed([2]))  # the last copy
    assert (await harness.one(toks, "w")).hit_tokens == 16
