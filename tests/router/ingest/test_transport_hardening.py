"""Issue 14 (transport side): bounded replay answers, a replay that cannot open its socket,
a supervised subscription task, and bad frames logged for as long as they come."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import zmq
import zmq.asyncio
from _helpers import FakeEngine, batch, start_subscribed, stored, wait_until

from publisher import ZmqEventPublisher
from router.config import RouterSettings, WorkerSpec
from router.ingest.replay_client import ReplayFailed, ReplayTooLarge, request_replay
from router.netutil import free_port
from router.service import RouterService


async def test_replay_answer_is_bounded_in_bytes_and_frames(engine: FakeEngine):
    for _ in range(20):
        await engine.publish_payload(b"x" * 100_000, deliver=False)
    ctx = zmq.asyncio.Context()
    try:
        assert engine.replay_endpoint is not None
        with pytest.raises(ReplayTooLarge, match="bytes"):
            await request_replay(ctx, engine.replay_endpoint, 0, timeout_s=5, max_bytes=1 << 20)
        with pytest.raises(ReplayTooLarge, match="10 frames"):
            await request_replay(ctx, engine.replay_endpoint, 0, timeout_s=5, max_frames=10)
        frames, _ = await request_replay(ctx, engine.replay_endpoint, 0, timeout_s=5)
        assert len(frames) == 20
    finally:
        ctx.destroy(linger=0)


async def test_oversized_replay_is_counted_and_the_worker_carries_on(engine: FakeEngine):
    svc, sub = await start_subscribed(engine, replay_max_bytes=1 << 20)
    try:
        for _ in range(20):  # 2 MB the router never sees live: the gap asks a replay
            await engine.publish_payload(b"x" * 100_000, deliver=False)
        await engine.publish(batch(stored([1, 2], list(range(8)))))
        await wait_until(lambda: sub.counters.replay_overflows >= 1, what="overflow counted")
        assert sub.counters.replay_failures >= 1
        metrics = await svc.metrics.render()
        assert b'kvroute_replay_overflows_total{worker="w0"} 1.0' in metrics
        await engine.publish(batch(stored([3], list(range(100, 104)))))
        await wait_until(lambda: sub.last_seq.get(0, -1) >= 21, what="later batch applied")
    finally:
        await svc.stop()


async def test_replay_without_a_free_socket_fails_cleanly(engine: FakeEngine):
    """The DEALER is created inside the try: a full context is a ReplayFailed, not a
    ZMQError escaping into (and killing) the subscription task."""
    ctx = zmq.asyncio.Context()
    ctx.set(zmq.MAX_SOCKETS, 2)
    held = []
    try:
        with pytest.raises(zmq.ZMQError):
            for _ in range(10):
                held.append(ctx.socket(zmq.PAIR))
        assert engine.replay_endpoint is not None
        with pytest.raises(ReplayFailed, match="replay from"):
            await request_replay(ctx, engine.replay_endpoint, 0, timeout_s=1)
    finally:
        for s in held:
            s.close(linger=0)
        ctx.destroy(linger=0)


async def test_subscription_task_is_supervised_and_restarted(
    engine: FakeEngine, caplog: pytest.LogCaptureFixture
):
    svc, sub = await start_subscribed(engine)
    try:
        writer = sub._writer
        real_flush = writer.flush
        failures = {"left": 1}

        async def flaky_flush() -> None:  # a fault injected once into the apply loop
            if failures["left"]:
                failures["left"] -= 1
                raise RuntimeError("injected")
            await real_flush()

        writer.flush = flaky_flush
        caplog.set_level(logging.ERROR, logger="router.ingest.subscription")
        await engine.publish(batch(stored([1, 2], list(range(8)))))
        await wait_until(lambda: sub.counters.task_restarts == 1, what="task restarted")
        await wait_until(lambda: sub.last_seq.get(0, -1) >= 0, what="batch applied")
        await engine.publish(batch(stored([3], list(range(100, 104)))))
        await wait_until(lambda: sub.last_seq.get(0, -1) >= 1, what="later batch applied")
        assert any("subscription task failed" in r.getMessage() for r in caplog.records)
        assert b'kvroute_task_restarts_total{worker="w0"} 1.0' in await svc.metrics.render()
    finally:
        await svc.stop()


async def test_bad_frames_keep_being_logged(engine: FakeEngine, caplog: pytest.LogCaptureFixture):
    """Not "once per process": each of the first few bad frames is logged, with a count."""
    caplog.set_level(logging.WARNING, logger="router.ingest.subscription")
    svc, sub = await start_subscribed(engine)
    try:
        for _ in range(4):
            await engine.publish_payload(b"\xc1 not msgpack")
        await engine.publish(batch(stored([1, 2], list(range(8)))))
        await wait_until(lambda: sub.last_seq.get(0, -1) >= 4, what="good batch applied")
        lines = [r.getMessage() for r in caplog.records if "undecodable" in r.getMessage()]
        assert len(lines) >= 4 and "4 so far" in lines[3], lines
    finally:
        await svc.stop()


@pytest.mark.parametrize("mode", ["bind", "listen"])
async def test_a_message_over_the_size_limit_is_refused_and_counted_as_a_gap(mode: str) -> None:
    """``sub_max_message_bytes`` (ZMQ_MAXMSGSIZE) on a SUB the router binds (a worker with
    ``bind``, the ``listen`` SUB): a bigger batch never reaches the index, its gap is
    counted, and the engine (which connects) is back with its next batches. (No replay
    endpoint here: nothing brings the batch back.)"""
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    listen = endpoint if mode == "listen" else None
    svc = RouterService(RouterSettings(sub_max_message_bytes=64 << 10, listen=listen))
    await svc.start()
    pub = ZmqEventPublisher(endpoint, topic="kv@w")  # connects, like vLLM for a host and port
    sent = [0]

    async def info() -> Any:
        return next((w for w in await svc.worker_infos() if w.worker_id == "w"), None)

    def publish_small() -> None:
        sent[0] += 1
        pub.publish(batch(stored([10**9 + sent[0]], [sent[0]] * 4)))

    async def applied() -> bool:  # PUB/SUB drops what precedes a subscription
        publish_small()
        return (w := await info()) is not None and w.events > 0

    async def gap_counted() -> bool:
        publish_small()
        return (await info()).gaps >= 1

    try:
        if mode == "bind":
            spec = WorkerSpec(worker_id="w", endpoint=endpoint, bind=True, topic="kv@w")
            await svc.add_worker(spec)
        await wait_until(applied, "a small batch before the big one")
        n = 40_000  # 10k blocks, ~200 KB of token ids in msgpack
        pub.publish(batch(stored(list(range(1, n // 4 + 1)), [70_000 + k for k in range(n)])))
        await wait_until(gap_counted, "the big batch's gap")
        assert (await svc.index.stats())["entries"] <= sent[0]  # none of the 10k blocks
        metrics = await svc.metrics.render()
        assert b'kvroute_gaps_total{worker="w"} 1.0' in metrics
    finally:
        pub.shutdown()
        await svc.stop()


async def test_a_connecting_sub_is_reopened_after_an_oversized_message(engine: FakeEngine):
    """Where the router connects, libzmq ends the session for good on an oversized
    message (no reconnect attempt follows); the subscription notices the silence of its
    monitor and connects again, and the replay on reconnecting (or the gap's) -- bounded
    by ``replay_max_bytes``, not by the live limit -- brings the batch back."""
    svc, sub = await start_subscribed(engine, sub_max_message_bytes=64 << 10)
    try:
        n = 40_000  # 10k blocks, ~200 KB of token ids in msgpack
        big = await engine.publish(batch(stored(list(range(1, n // 4 + 1)), [7] * n)))
        await wait_until(lambda: sub.counters.reopened >= 1, what="connection reopened")
        await engine.wait_subscribed(2)
        last = await engine.publish(batch(stored([10**9], [1, 2, 3, 4])))
        await wait_until(lambda: sub.last_seq.get(0, -1) >= last, what="later batch applied")
        assert last > big and sub.last_seq[0] == last
        assert (await svc.index.stats())["entries"] >= n // 4  # replayed
        metrics = await svc.metrics.render()
        assert b'kvroute_reopened_connections_total{worker="w0"} 1.0' in metrics
    finally:
        await svc.stop()


async def test_a_frame_naming_a_rank_out_of_bounds_is_refused(engine: FakeEngine) -> None:
    """Each DP rank keeps a seq in the subscription, the index and a ``kvroute_last_seq``
    series: frames naming thousands of ranks grew all three without bound. A frame whose
    rank is outside [0, MAX_RANKS) is an undecodable frame: counted, not applied, its
    seq not a gap."""
    from router.ingest.sequencing import MAX_RANKS

    svc, sub = await start_subscribed(engine)
    try:
        for rank in (MAX_RANKS, 2**40, -1):
            await engine.publish(batch(stored([rank & 0xFFFF], list(range(4))), rank=rank))
        await engine.publish(batch(stored([1, 2], list(range(8)))))
        await wait_until(lambda: sub.last_seq.get(0, -1) == 3, what="the good batch applied")
        assert sub.last_seq == {0: 3}
        assert sub.counters.decode_errors == 3 and sub.counters.gaps == 0
        assert await svc.index.load_seqs("w0") == {0: (3, sub._seq.top_print)}
    finally:
        await svc.stop()
