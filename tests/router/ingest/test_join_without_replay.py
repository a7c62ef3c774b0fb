"""A worker without a replay endpoint whose first frame is past seq 0: the batches before
it cannot be fetched, so its estimates are lower bounds (``partial_history``), as after a
gap there. It was applied as if nothing came before."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from _helpers import FakeEngine, batch, hits, store_chain, subscribe, wait_until

from router.config import RouterSettings
from router.service import RouterService
from schemas import AllBlocksCleared


@pytest.fixture
async def fleet() -> AsyncIterator[tuple[RouterService, FakeEngine, Any]]:
    """A router subscribed to one engine that has no replay endpoint."""
    engine = FakeEngine(replay=False)
    svc = RouterService(RouterSettings())
    await svc.start()
    try:
        yield svc, engine, await subscribe(svc, engine)
    finally:
        await svc.stop()
        await engine.close()


async def test_joining_mid_stream_without_replay_is_partial_history(
    fleet: tuple[RouterService, FakeEngine, Any],
) -> None:
    svc, engine, sub = fleet
    await engine.publish(batch(store_chain(0)), deliver=False)  # before we listened
    await engine.publish(batch(store_chain(1)))
    await wait_until(lambda: sub.last_seq.get(0) == 1, what="seq 1 applied")
    assert sub.partial_history is True
    assert (await svc.worker_info("w0")).partial_history is True
    assert await hits(svc, "w0", 1) == 8
    # The engine starts over: nothing before is missing any more.
    await engine.publish(batch(AllBlocksCleared(), store_chain(2)))
    await wait_until(lambda: sub.last_seq.get(0) == 2, what="seq 2 applied")
    assert sub.partial_history is False


async def test_a_first_frame_at_seq_0_is_the_whole_history(
    fleet: tuple[RouterService, FakeEngine, Any],
) -> None:
    _, engine, sub = fleet
    await engine.publish(batch(store_chain(0)))
    await wait_until(lambda: sub.last_seq.get(0) == 0, what="seq 0 applied")
    assert sub.partial_history is False
