"""``Ingestor.on_clear``: an engine's cache reset (AllBlocksCleared) is reported, once the
index took it -- and only that: not a resync, not a new hash unit, not a reset a resync
replays from the publisher's buffer again."""

from __future__ import annotations

import logging

import pytest
from _helpers import stored
from _kv_streams import Harness, cleared, tokens, wire

from router.index import make_index
from router.index.base import EngineSettings


@pytest.fixture
def harness() -> Harness:
    return Harness.build(make_index("memory"))


def _listen(harness: Harness) -> list[str]:
    heard: list[str] = []
    harness.ingestor.on_clear.append(heard.append)
    return heard


async def test_an_engine_clear_is_reported_with_its_worker(harness: Harness) -> None:
    heard = _listen(harness)
    toks = tokens(8)
    await harness.feed("w", stored([1, 2], toks))
    await harness.feed("v", stored([1, 2], toks))
    assert heard == []
    await harness.feed("w", stored([3], tokens(4, seed=1)), cleared())
    assert heard == ["w"]
    assert (await harness.one([*toks, 0], "w")).hit_tokens == 0  # the index took it
    assert (await harness.one([*toks, 0], "v")).hit_tokens == 8


async def test_resyncs_and_hash_unit_changes_are_not_reported(harness: Harness) -> None:
    heard = _listen(harness)
    await harness.feed("w", stored([1, 2], tokens(8)))
    await harness.ingestor.clear_worker("w")  # a resync: the engine's cache is intact
    # A store at a smaller unit voids the keys chained so far (the same clear op).
    await harness.feed("w", stored([5], tokens(2), block_size=2))
    assert harness.ingestor.counters.hash_unit_changes == 1
    await harness.ingestor.configure("v", EngineSettings(hash_block_size=4))
    await harness.ingestor.configure("v", EngineSettings(hash_block_size=8))  # a new unit
    assert harness.ingestor.counters.worker_clears == 2
    assert heard == []


async def test_a_replayed_clear_is_reported_once(harness: Harness) -> None:
    heard = _listen(harness)
    reset = wire(cleared())
    await harness.ingestor.apply_batch("w", reset, [(0, 0, 7, 1234)])
    assert heard == ["w"]
    # A resync rebuilds from the publisher's buffer, which still holds that reset.
    await harness.ingestor.clear_worker("w")
    await harness.ingestor.apply_batch("w", reset, [(0, 0, 7, 1234)])
    assert heard == ["w"]
    # A later reset is a new one; so is one another worker published.
    await harness.ingestor.apply_batch("w", reset, [(0, 0, 9, 5678)])
    await harness.ingestor.apply_batch("v", reset, [(0, 0, 7, 1234)])
    assert heard == ["w", "w", "v"]
    # The clear's own published batch counts, not the first one merged with it.
    merged = wire(stored([1], tokens(4)), cleared())
    await harness.ingestor.apply_batch("w", merged, [(0, 0, 10, 1), (1, 0, 11, 2)])
    await harness.ingestor.apply_batch("w", wire(cleared()), [(0, 0, 11, 2)])
    assert heard == ["w", "w", "v", "w"]


async def test_a_failing_listener_does_not_fail_the_write(
    harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(worker_id: str) -> None:
        raise RuntimeError("listener bug")

    harness.ingestor.on_clear.append(broken)
    heard = _listen(harness)
    with caplog.at_level(logging.ERROR):
        await harness.ingestor.apply_batch("w", wire(cleared()))
    assert heard == ["w"]
    assert "on_clear listener failed for worker w" in caplog.text
