"""``kv_cache_report_mode: "full"`` re-announcements against copies (vLLM 0.33), through
the real ingestor and scorer on both backends.

A re-announcement (``emit_cached_block_events``) re-sends a hit as a chain start per
group: blocks cached already, no new copy. A recompute from 0 (``cache_full_blocks``)
has the same shape and *is* a new copy. Each test removes one copy afterwards, so a
wrong call shows in the score.
"""

from __future__ import annotations

import pytest
from _kv_streams import SWA, Harness, gpu_removed, store16, tokens, wire


async def test_reannouncement_without_new_blocks_is_no_copy(report_full: Harness) -> None:
    toks = tokens(100, seed=1)
    await report_full.feed("w", store16([1, 2, 3], toks[:48], None))
    # A later request hits the three blocks and computes no new full block this step.
    await report_full.feed("w", store16([1, 2, 3], toks[:48], None))
    assert report_full.ingestor.counters.reannounced_blocks == 3
    await report_full.feed("w", gpu_removed([3]))  # the one copy vLLM had
    assert (await report_full.one(toks, "w")).hit_tokens == 32


async def test_reannouncement_of_blocks_cached_earlier_in_the_step(report_full: Harness) -> None:
    toks = tokens(100, seed=2)
    # One step: request A computes two blocks, request REPORT_BLOCK (same prefix) hits them.
    await report_full.feed("w", store16([1, 2], toks[:32], None), store16([1, 2], toks[:32], None))
    await report_full.feed("w", gpu_removed([2]))
    assert (await report_full.one(toks, "w")).hit_tokens == 16


async def test_recompute_after_eviction_in_the_step_is_a_copy(report_full: Harness) -> None:
    toks = tokens(100, seed=3)
    await report_full.feed("w", store16([1, 2], toks[:32], None))
    # One step: an allocation evicts both blocks, then a request (its lookup missed)
    # computes them again from 0.
    await report_full.feed(
        "w", gpu_removed([2]), gpu_removed([1]), store16([1, 2], toks[:32], None)
    )
    assert report_full.ingestor.counters.reannounced_blocks == 0
    assert (await report_full.one(toks, "w")).hit_tokens == 32


async def test_hybrid_recompute_when_the_window_missed_is_a_copy(report_full: Harness) -> None:
    toks = tokens(100, seed=4)
    full = store16([1, 2, 3], toks[:48], None)
    await report_full.feed("w", full, store16([1, 2, 3], toks[:48], None, 1, SWA))
    await report_full.feed("w", gpu_removed([3, 2, 1], 1))  # the window's blocks left
    assert (await report_full.one(toks, "w")).hit_tokens == 0
    # Full attention holds the prefix, the window does not: vLLM's lookup missed and the
    # request recomputed from 0 (a copy in both groups), not a re-announcement.
    await report_full.feed("w", full, store16([1, 2, 3], toks[:48], None, 1, SWA))
    assert report_full.ingestor.counters.reannounced_blocks == 0
    await report_full.feed("w", gpu_removed([3]))  # the older full-attention copy
    assert (await report_full.one(toks, "w")).hit_tokens == 48
    # And a hit it re-announces (the window held) is no copy in either group.
    await report_full.feed("w", full, store16([1, 2, 3], toks[:48], None, 1, SWA))
    assert report_full.ingestor.counters.reannounced_blocks == 6


@pytest.mark.parametrize("one_write", [False, True], ids=["batch-each", "one-write"])
async def test_reannouncement_after_one_of_two_copies_left(
    report_full: Harness, one_write: bool
) -> None:
    toks = tokens(100, seed=5)
    await report_full.feed("w", store16([1], toks[:16], None), store16([2], toks[16:32], 1))
    await report_full.feed("w", store16([2], toks[16:32], 1))  # a resend re-caches it: 2 copies
    evict, reannounce = wire(gpu_removed([2])), wire(store16([1, 2], toks[:32], None))
    if one_write:  # a subscriber that fell behind applies both in one write
        await report_full.ingestor.apply_batches([("w", evict), ("w", reannounce)])
    else:
        await report_full.ingestor.apply_batch("w", evict)
        await report_full.ingestor.apply_batch("w", reannounce)
    assert report_full.ingestor.counters.reannounced_blocks == 2
    await report_full.feed("w", gpu_removed([2]))  # the last copy
    assert (await report_full.one(toks, "w")).hit_tokens == 16
