"""Subscriber behaviour over real ZMQ sockets: order, gaps, replay, resync, garbage, DP ranks.

Each test drives a ``FakeEngine`` (XPUB + replay ROUTER we control) into a real
``RouterService`` with the in-memory index, and checks the index through the scorer.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import pytest
import zmq
import zmq.asyncio
from _helpers import FakeEngine, batch, chain, hits, removed, store_chain, wait_until

from router.config import RouterSettings, WorkerSpec
from router.ingest.sequencing import SeqTracker, Verdict
from router.netutil import InvalidEndpoint
from router.service import RouterService

BS = 4


@pytest.fixture
async def service() -> AsyncIterator[RouterService]:
    svc = RouterService(RouterSettings(replay_timeout_s=1.0))
    await svc.start()
    yield svc
    await svc.stop()


async def register(svc: RouterService, eng: FakeEngine, worker_id: str = "w0", **kw: Any) -> Any:
    await svc.add_worker(WorkerSpec(**eng.spec(worker_id, **kw)))
    await eng.wait_subscribed()
    sub = svc.subscriptions.get(worker_id)
    assert sub is not None
    # The start-up catch-up replay has been answered once the buffer state is known.
    if eng.replay_endpoint is not None:
        await wait_until(lambda: len(eng.replay_requests) >= 1 and not sub.syncing)
    return sub


async def applied(sub: Any, seq: int, rank: int = 0) -> None:
    await wait_until(lambda: sub.last_seq.get(rank, -1) >= seq, what=f"seq {seq} applied")


async def test_in_order_frames_are_applied_once(service: RouterService, engine: FakeEngine):
    sub = await register(service, engine)
    for i in range(3):
        await engine.publish(batch(store_chain(i)))
    await applied(sub, 2)
    assert sub.counters.batches == 3
    assert sub.counters.gaps == 0 and sub.counters.resyncs == 0
    assert sub.state == "connected"
    assert [await hits(service, "w0", i) for i in range(3)] == [8, 8, 8]


async def test_startup_replay_learns_what_was_published_before(
    service: RouterService, engine: FakeEngine
):
    for i in range(2):  # nobody listens yet: only the replay buffer has these
        await engine.publish(batch(store_chain(i)), deliver=False)
    sub = await register(service, engine)
    await applied(sub, 1)
    assert engine.replay_requests[0] == 0
    assert [await hits(service, "w0", i) for i in range(2)] == [8, 8]
    assert sub.counters.resyncs == 0


async def test_gap_is_replayed_and_each_batch_applied_exactly_once(
    service: RouterService, engine: FakeEngine
):
    sub = await register(service, engine)
    await engine.publish(batch(store_chain(0)))
    await applied(sub, 0)
    await engine.publish(batch(store_chain(1)), deliver=False)  # lost on the way
    await engine.publish(batch(store_chain(2)))
    await engine.publish(batch(store_chain(3)))
    await applied(sub, 3)
    assert sub.counters.gaps == 1
    assert engine.replay_requests[-1] == 1
    assert sub.counters.batches == 4  # 0, 1 and 2 (replayed), 3; never twice
    assert sub.counters.resyncs == 0
    assert [await hits(service, "w0", i) for i in range(4)] == [8, 8, 8, 8]


async def test_gap_older_than_buffer_clears_and_rebuilds(service: RouterService):
    engine = FakeEngine(buffer=2)
    try:
        sub = await register(service, engine)
        await engine.publish(batch(store_chain(0)))
        await applied(sub, 0)
        for i in (1, 2, 3):
            await engine.publish(batch(store_chain(i)), deliver=False)
        await engine.publish(batch(store_chain(4)))  # buffer now holds seqs 3, 4
        await applied(sub, 4)
        assert sub.counters.gaps == 1 and sub.counters.resyncs == 1
        # Chain 0 was cleared (its fate is unknown after the hole); 3 and 4 rebuilt.
        assert [await hits(service, "w0", i) for i in range(5)] == [0, 0, 0, 8, 8]
        assert sub.state == "connected"
    finally:
        await engine.close()


async def test_publisher_restart_resyncs(service: RouterService, engine: FakeEngine):
    sub = await register(service, engine)
    for i in range(3):
        await engine.publish(batch(store_chain(i)))
    await applied(sub, 2)
    engine.restart_seq()  # a new process: seq restarts at 0, empty cache
    await engine.publish(batch(store_chain(5)))
    await wait_until(lambda: sub.counters.resyncs == 1, what="resync")
    await applied(sub, 0)
    assert [await hits(service, "w0", i) for i in (0, 1, 2, 5)] == [0, 0, 0, 8]
    await engine.publish(batch(store_chain(6)))
    await applied(sub, 1)
    assert sub.counters.resyncs == 1 and sub.counters.gaps == 0


async def test_gap_without_replay_endpoint_resyncs(service: RouterService):
    engine = FakeEngine(replay=False)
    try:
        sub = await register(service, engine)
        await engine.publish(batch(store_chain(0)))
        await applied(sub, 0)
        await engine.publish(batch(store_chain(1)), deliver=False)
        await engine.publish(batch(store_chain(2)))
        await applied(sub, 2)
        assert sub.counters.gaps == 1 and sub.counters.resyncs == 1
        assert [await hits(service, "w0", i) for i in range(3)] == [0, 0, 8]
    finally:
        await engine.close()


async def test_silent_replay_endpoint_times_out_without_wedging(service: RouterService):
    engine = FakeEngine(replay=False)
    silent = zmq.asyncio.Context()
    router = silent.socket(zmq.ROUTER)  # bound, never answers
    router.bind("tcp://127.0.0.1:*")
    try:
        service.settings.replay_timeout_s = 0.2
        spec = engine.spec("w0", replay_endpoint=router.getsockopt_string(zmq.LAST_ENDPOINT))
        await service.add_worker(WorkerSpec(**spec))
        await engine.wait_subscribed()
        sub = service.subscriptions.get("w0")
        assert sub is not None
        await wait_until(lambda: sub.counters.replay_failures >= 1, what="startup replay timeout")
        await engine.publish(batch(store_chain(0)), deliver=False)
        await engine.publish(batch(store_chain(1)))  # first frame at seq 1: catch-up fails
        await applied(sub, 1)
        await engine.publish(batch(store_chain(2)), deliver=False)
        await engine.publish(batch(store_chain(3)))  # gap: replay times out -> resync
        await applied(sub, 3)
        assert sub.counters.replay_failures == 3
        assert sub.counters.resyncs == 1
        assert [await hits(service, "w0", i) for i in range(4)] == [0, 0, 0, 8]
    finally:
        silent.destroy(linger=0)
        await engine.close()


async def test_garbage_frames_are_counted_and_never_touch_the_index(
    service: RouterService, engine: FakeEngine
):
    sub = await register(service, engine)
    await engine.publish(batch(store_chain(0)))
    await applied(sub, 0)
    before = service.ingestor.counters.as_dict()
    await engine.send_raw([b"only-two", b"frames"])
    await engine.send_raw([b"", b"\x00\x01", b"short seq"])
    await engine.send_raw([b"", b"", b"", b"", b"five"])
    await engine.publish_payload(b"\xc1 not msgpack")  # seq 1, undecodable
    await engine.publish_payload(msgspec.msgpack.encode({"a": 1}))  # seq 2, wrong shape
    unknown = msgspec.msgpack.encode([1.0, [{"type": "BlockTeleported", "x": 1}], 0])
    await engine.publish_payload(unknown)  # seq 3: decodes, event skipped
    await engine.publish(batch(store_chain(1)))  # seq 4
    await applied(sub, 4)
    assert sub.counters.decode_errors == 5
    assert sub.decode_stats.unknown_event_types == 1
    assert sub.counters.gaps == 0 and sub.counters.resyncs == 0  # bad seqs are not gaps
    after = service.ingestor.counters.as_dict()
    assert after["blocks_stored"] == before["blocks_stored"] + 2  # chain 1 only
    assert [await hits(service, "w0", i) for i in range(2)] == [8, 8]


async def test_two_dp_ranks_on_one_endpoint_are_tracked_apart(
    service: RouterService, engine: FakeEngine
):
    sub = await register(service, engine)
    rank_seq = {0: 0, 1: 0}
    for i, rank in enumerate([0, 1, 1, 0, 1]):
        payload = msgspec.msgpack.encode(batch(store_chain(i), rank=rank))
        seq = rank_seq[rank]
        rank_seq[rank] += 1
        await engine.send_raw([b"", seq.to_bytes(8, "big"), payload])
    await applied(sub, 1, rank=0)
    await applied(sub, 2, rank=1)
    assert sub.last_seq == {0: 1, 1: 2}
    assert sub.counters.gaps == 0 and sub.counters.resyncs == 0
    assert sub.counters.batches == 5
    assert [await hits(service, "w0", i) for i in range(5)] == [8] * 5


async def test_topic_prefix_filter(service: RouterService):
    engine = FakeEngine(topic="kv@w0")
    try:
        sub = await register(service, engine)
        await engine.publish(batch(store_chain(0)))
        await engine.send_raw(
            [b"other", (1).to_bytes(8, "big"), msgspec.msgpack.encode(batch(store_chain(1)))]
        )
        await engine.publish(batch(store_chain(2)))  # seq 1 of our topic
        await applied(sub, 1)
        assert [await hits(service, "w0", i) for i in range(3)] == [8, 0, 8]
    finally:
        await engine.close()


async def test_removals_and_clear_flow_through(service: RouterService, engine: FakeEngine):
    sub = await register(service, engine)
    await engine.publish(batch(store_chain(0), store_chain(1)))
    await engine.publish(batch(removed(chain(0)[0])))
    await applied(sub, 1)
    assert [await hits(service, "w0", i) for i in range(2)] == [0, 8]
    await engine.publish(batch(msgspec_clear()))
    await applied(sub, 2)
    assert await hits(service, "w0", 1) == 0


def msgspec_clear() -> Any:
    from schemas import AllBlocksCleared

    return AllBlocksCleared()


async def test_reconnects_when_the_engine_comes_back(service: RouterService):
    engine = FakeEngine(replay=False)
    sub = await register(service, engine)
    await engine.publish(batch(store_chain(0)))
    await applied(sub, 0)
    endpoint = engine.endpoint
    await engine.close()
    await wait_until(lambda: sub.state == "disconnected", what="disconnect seen")
    engine = await wait_until(lambda: _bind_again(endpoint), what="port free again")
    try:
        await engine.wait_subscribed()
        await wait_until(lambda: sub.state == "connected", what="reconnect seen")
        engine.next_seq = 1  # the same process, back on the network
        await engine.publish(batch(store_chain(1)))
        await applied(sub, 1)
        assert [await hits(service, "w0", i) for i in range(2)] == [8, 8]
        assert sub.counters.gaps == 0
    finally:
        await engine.close()


def _bind_again(endpoint: str) -> FakeEngine | None:
    try:
        return FakeEngine(replay=False, endpoint=endpoint)
    except zmq.ZMQError:  # ZMQ releases a closed socket's port asynchronously
        return None


async def test_invalid_endpoint_is_refused(service: RouterService):
    # WorkerSpec itself refuses it now; unvalidated, ZMQ's refusal is still mapped.
    with pytest.raises(InvalidEndpoint):
        await service.add_worker(
            WorkerSpec.model_construct(worker_id="bad", endpoint="tcp://*:5557")
        )
    assert "bad" not in service.subscriptions


async def test_api_stays_responsive_while_a_backlog_drains(
    service: RouterService, engine: FakeEngine
):
    sub = await register(service, engine)
    n = 3000
    for i in range(n):
        await engine.publish(batch(store_chain(i)))
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    task = asyncio.create_task(ticker())
    await applied(sub, n - 1)
    task.cancel()
    assert ticks > n // 512  # the event loop ran other tasks while draining


# ----------------------------------------------------------------- the pure state machine


def verdicts(tracker: SeqTracker, frames: list[tuple[int, int]]) -> list[str]:
    out = []
    for rank, seq in frames:
        d = tracker.observe_live(rank, seq)
        out.append(d.verdict.value + (f"@{d.start}" if d.verdict in (Verdict.GAP,) else ""))
        if d.verdict is Verdict.APPLY:
            tracker.mark_applied(rank, seq)
    return out


def test_tracker_shared_counter_across_ranks():
    # The golden vLLM capture: one publisher, ranks 0 and 1 share one seq counter.
    t = SeqTracker()
    assert verdicts(t, [(0, 0), (0, 1), (1, 2), (0, 3), (0, 4)]) == ["apply"] * 5
    assert t.shared
    assert verdicts(t, [(1, 6)]) == ["gap@5"]


def test_tracker_per_rank_counters():
    t = SeqTracker()
    frames = [(0, 0), (1, 0), (1, 1), (0, 1), (1, 2), (0, 2)]
    assert verdicts(t, frames) == ["apply"] * 6
    assert not t.shared
    assert verdicts(t, [(0, 4)]) == ["gap@3"]


def test_tracker_join_restart_duplicates_and_bad_seqs():
    t = SeqTracker()
    assert t.observe_live(0, 7).verdict is Verdict.JOIN
    t.mark_applied(0, 9)  # a catch-up replay applied up to 9
    assert verdicts(t, [(0, 8), (0, 9), (0, 10)]) == ["duplicate", "duplicate", "apply"]
    t.mark_bad(11)
    t.mark_bad(12)
    assert verdicts(t, [(0, 13)]) == ["apply"]  # only undecodable frames in between
    assert verdicts(t, [(0, 2)]) == ["restart"]
    t.forget_applied()
    assert t.is_new(0, 0)


async def test_a_frame_corrupted_in_transit_is_replayed_from_the_buffer(
    service: RouterService, engine: FakeEngine
):
    """The publisher's buffer holds the good copy of a frame that arrived undecodable."""
    sub = await register(service, engine)
    await engine.publish(batch(store_chain(0)))
    seq = await engine.publish(batch(store_chain(1)), deliver=False)
    await engine.pub.send_multipart([engine.topic, seq.to_bytes(8, "big"), b"\xc1garbage"])
    await applied(sub, seq)
    assert sub.counters.decode_errors == 1
    assert [await hits(service, "w0", i) for i in range(2)] == [8, 8]
    # Later removals apply on top of the repaired state (nothing stale, nothing lost).
    hashes, _ = chain(1)
    await engine.publish(batch(removed(hashes[1:])))
    await applied(sub, seq + 1)
    assert await hits(service, "w0", 1) == 4


async def test_a_frame_lost_at_the_tail_is_fetched_when_the_stream_goes_quiet(
    engine: FakeEngine,
):
    """No later frame would reveal the gap: the idle-time tail check does."""
    svc = RouterService(RouterSettings(replay_timeout_s=1.0, tail_check_s=0.3))
    await svc.start()
    try:
        sub = await register(svc, engine)
        await engine.publish(batch(store_chain(0)))
        await applied(sub, 0)
        seq = await engine.publish(batch(store_chain(1)), deliver=False)  # lost in transit
        await applied(sub, seq)
        assert await hits(svc, "w0", 1) == 8
        assert sub.counters.tail_checks >= 1 and sub.counters.gaps == 1
    finally:
        await svc.stop()


async def test_remove_and_register_again_never_interleave(engine: FakeEngine):
    """Deleting a worker and registering the same id at once: the new subscription's
    first batch must survive (the old removal deletes only what came before)."""
    svc = RouterService(RouterSettings(replay_timeout_s=1.0))
    await svc.start()
    try:
        await register(svc, engine)
        await engine.publish(batch(store_chain(0)))
        await wait_until(lambda: svc.subscriptions.get("w0").last_seq.get(0) == 0)  # type: ignore[union-attr]
        await asyncio.gather(
            svc.remove_worker("w0"), svc.add_worker(WorkerSpec(**engine.spec("w0")))
        )
        sub = svc.subscriptions.get("w0")
        assert sub is not None
        # The new subscription catches up from the publisher's buffer: chain 0 is back.
        await wait_until(lambda: sub.last_seq.get(0) == 0, what="catch-up after re-register")
        assert await hits(svc, "w0", 0) == 8
    finally:
        await svc.stop()
