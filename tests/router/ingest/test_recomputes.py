"""Chain starts taken for re-announcements that a later store proves were recomputes
(``router.ingest.recomputes``), through the real ingestor and scorer, both backends.

The shape (vLLM 0.33, ``kv_cache_report_mode: "full"``): a request that skips the
prefix cache recomputes a held prefix from 0 in its first chunk -- a chain start over
held blocks, taken for a re-announcement -- and continues in its next step with a
chunk whose first block the worker held all along (a request reading the cache would
have hit it).
"""

from __future__ import annotations

import pytest
from _kv_streams import REPORT_BLOCK, SWA, Harness, gpu_removed, store16, tokens, wire

from router.index.base import GPU_BIT
from router.ingest.block_keys import request_keys
from router.ingest.recomputes import LOG_CAP, RECORD_AGE, RecomputeLog, Record


async def _copies(h: Harness, toks: list[int], n: int, group: int = 0) -> list[int]:
    return await h.index.copies("w", group, request_keys(toks, REPORT_BLOCK)[:n], GPU_BIT)


async def test_recompute_and_next_chunk_in_one_batch(report_full: Harness) -> None:
    """Both in one write (the subscriber merges the frames it has received): the
    continuation's block was held before the write."""
    toks = tokens(120, seed=26)
    await report_full.feed("w", store16([1, 2, 3, 4], toks[:64], None))
    await report_full.feed(
        "w", store16([1, 2, 3], toks[:48], None), store16([4, 5, 6], toks[48:96], 3)
    )
    assert await _copies(report_full, toks, 6) == [2, 2, 2, 2, 1, 1]


@pytest.mark.parametrize("one_write", [False, True], ids=["batch-each", "one-write"])
async def test_skip_cache_recompute_proven_by_its_next_chunk(
    report_full: Harness, one_write: bool
) -> None:
    toks = tokens(120, seed=21)
    await report_full.feed("w", store16([1, 2, 3, 4], toks[:64], None))
    first = wire(store16([1, 2, 3], toks[:48], None))  # the skip request's first chunk
    nxt = wire(store16([4, 5, 6], toks[48:96], 3))  # its next: block 4 held, recomputed
    if one_write:
        await report_full.ingestor.apply_batches([("w", first), ("w", nxt)])
    else:
        await report_full.ingestor.apply_batch("w", first)
        assert await _copies(report_full, toks, 3) == [1, 1, 1]  # taken for a re-announcement
        await report_full.ingestor.apply_batch("w", nxt)
    assert await _copies(report_full, toks, 6) == [2, 2, 2, 2, 1, 1]
    await report_full.feed("w", gpu_removed([1, 2, 3, 4]))  # the older copies evicted
    assert (await report_full.one(toks[:100], "w")).hit_tokens == 96


async def test_a_block_removed_meanwhile_gets_no_copy_back(report_full: Harness) -> None:
    """The removal may have taken the copy the index lacked: never one too many."""
    toks = tokens(120, seed=22)
    await report_full.feed("w", store16([1, 2, 3, 4], toks[:64], None))
    await report_full.feed("w", store16([1, 2, 3], toks[:48], None))
    await report_full.feed("w", gpu_removed([2]))
    await report_full.feed("w", store16([4, 5, 6], toks[48:96], 3))
    assert await _copies(report_full, toks, 4) == [2, 0, 2, 2]


async def test_a_block_stored_again_after_the_chain_start_proves_nothing(
    report_full: Harness,
) -> None:
    """A real re-announcement (hit 2 blocks, block 3 not held then), block 3 stored by
    another request, then the re-announcing request's next chunk: no copy added."""
    toks = tokens(120, seed=23)
    await report_full.feed("w", store16([1, 2], toks[:32], None))
    await report_full.feed("w", store16([1, 2], toks[:32], None))  # re-announcement
    await report_full.feed("w", store16([3], toks[32:48], 2))  # another request, same block
    await report_full.feed("w", store16([3, 4], toks[32:64], 2))
    assert await _copies(report_full, toks, 4) == [1, 1, 2, 1]


async def test_single_block_continuation_proves_nothing(report_full: Harness) -> None:
    """A resent prompt of 3 whole blocks: its cap keeps the hit at 2 (re-announced) and
    it recomputes block 3, held -- one block, as a decode step or a capped prompt."""
    toks = tokens(120, seed=24)
    await report_full.feed("w", store16([1, 2, 3], toks[:48], None))
    await report_full.feed("w", store16([1, 2], toks[:32], None), store16([3], toks[32:48], 2))
    assert await _copies(report_full, toks, 3) == [1, 1, 2]
    await report_full.feed("w", store16([1, 2], toks[:32], None))  # once more, in two steps
    await report_full.feed("w", store16([3], toks[32:48], 2))
    assert await _copies(report_full, toks, 3) == [1, 1, 3]


async def test_hybrid_workers_are_not_corrected(report_full: Harness) -> None:
    """Full attention + sliding window: a lookup can stop before a held full-attention
    block (the window lacked it), so a request reading the cache recomputes it."""
    toks = tokens(120, seed=25)
    full = store16([1, 2, 3], toks[:48], None)
    await report_full.feed("w", full, store16([1, 2, 3], toks[:48], None, 1, SWA))
    await report_full.feed("w", gpu_removed([3], 1))
    # Hit 2 blocks (the window holds blocks 1-2, not 3): re-announced in both groups.
    await report_full.feed(
        "w", store16([1, 2], toks[:32], None), store16([1, 2], toks[:32], None, 1, SWA)
    )
    assert report_full.ingestor.counters.reannounced_blocks == 4
    await report_full.feed(
        "w", store16([3, 4], toks[32:64], 2), store16([3, 4], toks[32:64], 2, 1, SWA)
    )
    assert await _copies(report_full, toks, 4) == [1, 1, 2, 1]


async def test_a_chunked_request_whose_lookup_predates_the_block_proves_nothing(
    report_full: Harness,
) -> None:
    """Q reads the cache (miss) and computes blocks 1-2; P, same prefix, hits them and
    computes block 3; R re-announces blocks 1-2 (its hit); Q's next chunk computes block
    3 again -- held since before R, but not when Q looked up."""
    toks = tokens(120, seed=27)
    await report_full.feed("w", store16([1, 2], toks[:32], None), store16([3, 9], toks[32:64], 2))
    await report_full.feed("w", store16([1, 2], toks[:32], None))  # R: a re-announcement
    assert report_full.ingestor.counters.reannounced_blocks == 2
    await report_full.feed("w", store16([3, 4], toks[32:64], 2))
    assert await _copies(report_full, toks, 3) == [1, 1, 2]


async def test_a_store_ending_there_long_ago_is_forgotten_once_evicted(
    report_full: Harness,
) -> None:
    """An old request ended at block 2 (then decoded block 3); all evicted since (a
    running request's blocks cannot be), so it is not the continuing request."""
    toks = tokens(120, seed=28)
    await report_full.feed("w", store16([1, 2], toks[:32], None))
    await report_full.feed("w", store16([3], toks[32:48], 2))
    await report_full.feed("w", gpu_removed([3]), gpu_removed([2]), gpu_removed([1]))
    await report_full.feed("w", store16([1, 2, 3, 4], toks[:64], None))
    await report_full.feed("w", store16([1, 2], toks[:32], None))  # a skip request's chunk
    await report_full.feed("w", store16([3, 4, 5], toks[32:80], 2))  # its next
    assert await _copies(report_full, toks, 5) == [2, 2, 2, 2, 1]


def test_the_log_stays_bounded_and_forgets_safely() -> None:
    """Pruned or never seen, a block's store time is unknown: no proof from it."""
    log = RecomputeLog()
    log.record(Record(0, 0, 7, [(0, [6, 7], [60, 70])]))
    log.note(0, [8], stored=True)
    for i in range(RECORD_AGE * 20):
        log.note(0, [1000 + i, 2000 + i, 3000 + i], stored=True)
        log.advance()
    assert len(log._stored) <= LOG_CAP and not log.records
    rec = Record(log.pos, 0, 7, [(0, [6, 7], [60, 70])])
    log.record(rec)
    assert not log.proves(rec, 8)  # stored long ago: pruned
    log.note(0, [9], stored=True)
    log.advance()
    assert not log.proves(rec, 9)  # stored after the chain start
