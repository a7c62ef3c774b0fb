"""A worker's group indices cost a score per group that exists, not per index up to the
largest: one event naming group ``2**64 - 1`` once made every /v1/score build a row per
index (seconds, gigabytes, a 500). Ingest now rejects such an index
(``tests/router/ingest/test_rejected_events_learn_nothing.py``); the scorer must also
cope with one already in an index (a Redis an older router wrote), on both backends and
every score path."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import pytest
from _kv_streams import EventSource, Harness, configured_harness, tokens

from router.index.base import GroupMeta
from router.score.scorer import GroupRow

BS = 16
FULL = GroupMeta("full_attention", BS)


@pytest.fixture(params=["memory", "redis"])
async def h(request: pytest.FixtureRequest) -> AsyncIterator[Harness]:
    harness = await configured_harness(request)
    yield harness
    await harness.index.close()


async def _with_groups(h: Harness, workers: list[str], extra: list[int]) -> list[int]:
    """Each worker holds a 4-block chain in group 0, and metadata for ``extra`` groups
    that never stored anything (as an older router persisted them)."""
    src = EventSource("foreign")
    toks = tokens(4 * BS + 1)
    for w in workers:
        await h.feed(w, src.store(toks, BS, 0, 4))
        state = await h.index.load_worker(w)
        assert state is not None
        state.groups.update((g, FULL) for g in extra)
        await h.index.save_worker(w, state)
    return toks


@pytest.mark.parametrize("n_workers", [1, 40, 130])  # per worker, columns, bitsets
@pytest.mark.parametrize("big", [1000, 2**64 - 1])
async def test_a_huge_group_index_costs_one_row(h: Harness, n_workers: int, big: int) -> None:
    workers = [f"w{i}" for i in range(n_workers)]
    toks = await _with_groups(h, workers, [big])
    t0 = time.monotonic()
    res = await h.scorer.score_result(toks, workers)
    assert time.monotonic() - t0 < 5
    assert len(res.workers) == n_workers
    for row in res.workers:
        assert (row.hit_tokens, row.learned) == (0, False)  # group 1 never announced
        assert row.groups == [
            GroupRow(0, "full_attention", BS),
            GroupRow(1, learned=False),
            GroupRow(big, "full_attention", BS),
        ]


async def test_each_gap_is_reported_where_it_starts(h: Harness) -> None:
    toks = await _with_groups(h, ["w"], [3, 4, 9])
    row = (await h.scorer.score_result(toks, ["w"])).workers[0]
    assert [(r.group_idx, r.learned) for r in row.groups] == [
        (0, True),
        (1, False),
        (3, True),
        (4, True),
        (5, False),
        (9, True),
    ]
    # The JSON answer (pydantic model) reads the same.
    model = await h.scorer.score(toks, ["w"])
    assert [g.group_idx for g in model.workers[0].groups] == [0, 1, 3, 4, 5, 9]
