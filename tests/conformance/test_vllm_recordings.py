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

from router.index import make_index

PATHS = recording_paths()
OUTCOMES: list[tuple[str, Outcome]] = []  # read by conftest's terminal summary


def test_recordings_present() -> None:
    """The replay tests below must not silently vanish with the fixtures."""
    assert len(PATHS) >= 10, [p.name for p in PATHS]
    for path in PATHS:
        rec = load(path)
        assert rec.vllm_version == "0.33.0"
        assert rec.probes, f"{rec.name}: no probes"
        assert any(s["op"] == "frame" for s in rec.steps), f"{rec.name}: no frames"


@pytest.fixture(params=["memory", "redis"])
async def kvroute(request: pytest.FixtureRequest) -> AsyncIterator[KvrouteUnderTest]:
    url = request.getfixturevalue("redis_url") if request.param == "redis" else None
    index = make_index(request.param, redis_url=url)
    yield KvrouteUnderTest(index)
    await index.close()


@pytest.mark.parametrize("path", PATHS, ids=[p.stem for p in PATHS])
async def test_vllm_recording(path: Path, kvroute: KvrouteUnderTest) -> None:
    rec = load(path)
    out = await replay(rec, kvroute)
    OUTCOMES.append((type(kvroute.index).__name__, out))
    assert out.rejects == {}, f"{rec.name}: events rejected {out.rejects}"
    assert out.exact == out.total, (
        f"{rec.name} ({rec.description}): {out.exact}/{out.total} probes exact "
        f"(over {out.over}, under {out.under}); first mismatches:\n  " + "\n  ".join(out.mismatches)
    )
