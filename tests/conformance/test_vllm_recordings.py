"""kvroute against vLLM 0.33's own answers: replay each recording, compare every probe.

Each recording (see ``tests/fixtures/vllm-conformance/README.md``) is vLLM's own event
stream and its own prefix-cache lookups; kvroute's score for the worker must equal what
vLLM reused, at every probe, on both index backends, and no event may be rejected.
One test per (scenario, backend), so each shape passes or fails on its own.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from recordings import KvrouteUnderTest, Outcome, load, recording_paths, replay

from conformance.scenarios import BY_NAME
from conformance.workload import actions
from router.index import make_index

PATHS = recording_paths()
OUTCOMES: list[tuple[str, Outcome]] = []  # read by conftest's terminal summary


def test_recordings_match_the_scenarios() -> None:
    """Every scenario has its recording, made from today's workload and settings (a
    changed workload without ``make conformance-record`` fails here, not in a parity
    test), with contiguous frames per DP rank and probes."""
    assert sorted(p.stem for p in PATHS) == sorted(BY_NAME)
    for path in PATHS:
        rec = load(path)
        sc = BY_NAME[rec.name]
        assert rec.vllm_version == "0.33.0"
        assert [s["action"] for s in rec.steps if s["op"] == "action"] == actions(sc)
        assert rec.worker["hash_block_size"] == sc.unit
        assert rec.worker["eagle"] == sc.eagle
        assert rec.worker["dp_ranks"] == sc.dp_ranks
        assert rec.groups == [
            {"kind": g.kind, "block_size": g.block_size, "sliding_window": g.sliding_window}
            for g in sc.groups
        ]
        seqs: dict[int, list[int]] = {}
        for s in rec.steps:
            if s["op"] == "frame":
                seqs.setdefault(s["dp_rank"], []).append(s["seq"])
        assert {r: list(range(len(v))) for r, v in seqs.items()} == seqs
        assert sorted(seqs) == list(range(sc.dp_ranks))
        assert len(rec.probes) >= 150, f"{rec.name}: {len(rec.probes)} probes"


@pytest.fixture(params=["memory", "redis"])
async def kvroute(request: pytest.FixtureRequest) -> AsyncIterator[KvrouteUnderTest]:
    url = request.getfixturevalue("redis_url") if request.param == "redis" else None
    index = make_index(request.param, redis_url=url)
    yield KvrouteUnderTest(index)
    await index.close()


@pytest.mark.parametrize("merged", [False, True], ids=["per-frame", "merged"])
@pytest.mark.parametrize("path", PATHS, ids=[p.stem for p in PATHS])
async def test_vllm_recording(path: Path, kvroute: KvrouteUnderTest, merged: bool) -> None:
    """Frames fed one write each, or all frames between two probes in one write (live,
    the subscriber applies whatever arrived meanwhile): the same answers."""
    rec = load(path)
    out = await replay(rec, kvroute, merged=merged)
    OUTCOMES.append((type(kvroute.index).__name__, out))
    assert out.rejects == {}, f"{rec.name}: events rejected {out.rejects}"
    assert out.exact == out.total, (
        f"{rec.name} ({rec.description}): {out.exact}/{out.total} probes exact "
        f"(over {out.over}, under {out.under}); first mismatches:\n  " + "\n  ".join(out.mismatches)
    )
