"""What a recovery costs and what it reports, over real sockets:

* a rebuild that cannot reach seq 0 -- a failed replay included -- leaves the worker's
  history partial (``partial_history``, ``lower_bound``, ``kvroute_worker_partial_history``):
  its engine still holds blocks the index no longer has;
* a run of undecodable frames costs one replay, not one per frame (each may wait
  ``replay_timeout_s``), and the wait shows in ``ingest_lag_s``;
* gap, restart and resync warnings are rate-limited; their counters count every one;
* a batch ZMQ refused for its size, fetched by the catch-up after the reopen, is a gap.
"""

from __future__ import annotations

import contextlib
import logging
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis
import zmq
import zmq.asyncio
from _helpers import FakeEngine, batch, chain, hits, store_chain, stored, subscribe, wait_until

from router.config import RouterSettings, WorkerSpec
from router.index.redis import worker_prefix
from router.ingest.conflicts import PublisherConflict
from router.service import RouterService
from schemas import AllBlocksCleared

GARBAGE = b"\xc1 not msgpack"


@contextlib.asynccontextmanager
async def silent_replay() -> AsyncIterator[str]:
    """A replay ROUTER that is bound and never answers; yields its endpoint."""
    ctx = zmq.asyncio.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.bind("tcp://127.0.0.1:*")
    try:
        yield sock.getsockopt_string(zmq.LAST_ENDPOINT)
    finally:
        ctx.destroy(linger=0)


async def start(
    engine: FakeEngine, replay_endpoint: str | None = None, **settings: Any
) -> tuple[RouterService, Any]:
    """A router with worker "w0" on ``engine``, its start-up catch-up replay done."""
    svc = RouterService(RouterSettings(**{"replay_timeout_s": 1.0, **settings}))
    await svc.start()
    extra = {} if replay_endpoint is None else {"replay_endpoint": replay_endpoint}
    await svc.add_worker(WorkerSpec(**engine.spec("w0", **extra)))
    await engine.wait_subscribed()
    sub = svc.subscriptions.get("w0")
    assert sub is not None
    if replay_endpoint is None:
        await wait_until(lambda: len(engine.replay_requests) >= 1 and not sub.syncing)
    else:
        await wait_until(lambda: sub.counters.replay_failures >= 1, what="catch-up timeout")
    return svc, sub


async def lower_bound(svc: RouterService, i: int) -> bool:
    return bool((await svc.score([*chain(i)[1], 7], ["w0"])).workers[0].lower_bound)


async def assert_partial(svc: RouterService, sub: Any, i: int) -> None:
    assert sub.partial_history
    assert (await svc.worker_info("w0")).partial_history
    assert await lower_bound(svc, i)
    assert b'kvroute_worker_partial_history{worker="w0"} 1.0' in await svc.metrics.render()


# ---------------------------------------------------------------- partial history


async def test_a_gap_whose_replay_times_out_leaves_the_history_partial():
    engine = FakeEngine(replay=False)
    try:
        async with silent_replay() as replay:
            svc, sub = await start(engine, replay, replay_timeout_s=0.3)
            try:
                await engine.publish(batch(store_chain(0)))  # the engine caches chain 0
                await wait_until(lambda: sub.last_seq.get(0) == 0, what="seq 0 applied")
                assert not sub.partial_history
                await engine.publish(batch(store_chain(1)), deliver=False)  # lost
                await engine.publish(batch(store_chain(2)))  # gap; its replay times out
                await wait_until(lambda: sub.last_seq.get(0) == 2, what="seq 2 applied")
                assert sub.counters.resyncs == 1 and sub.counters.replay_failures == 2
                # chain 0 was cleared although the engine still holds it: a lower bound
                assert await hits(svc, "w0", 0) == 0
                await assert_partial(svc, sub, 0)
            finally:
                await svc.stop()
    finally:
        await engine.close()


async def test_a_gap_whose_replay_is_too_large_leaves_the_history_partial(engine: FakeEngine):
    svc, sub = await start(engine, replay_max_frames=3)
    try:
        await engine.publish(batch(store_chain(0)))
        await wait_until(lambda: sub.last_seq.get(0) == 0, what="seq 0 applied")
        for i in range(1, 6):
            await engine.publish(batch(store_chain(i)), deliver=False)
        await engine.publish(batch(store_chain(6)))  # gap 1..5: 6 frames > 3
        await wait_until(lambda: sub.last_seq.get(0) == 6, what="seq 6 applied")
        assert sub.counters.replay_overflows == 1 and sub.counters.resyncs == 1
        await assert_partial(svc, sub, 6)
    finally:
        await svc.stop()


async def test_joining_mid_stream_when_the_replay_fails_is_partial():
    engine = FakeEngine(replay=False)
    try:
        async with silent_replay() as replay:
            svc, sub = await start(engine, replay, replay_timeout_s=0.3)
            try:
                await engine.publish(batch(store_chain(0)), deliver=False)
                await engine.publish(batch(store_chain(1)))  # the first frame we see
                await wait_until(lambda: sub.last_seq.get(0) == 1, what="seq 1 applied")
                await assert_partial(svc, sub, 1)
            finally:
                await svc.stop()
    finally:
        await engine.close()


async def test_joining_mid_stream_without_a_replay_endpoint_is_partial():
    """Nothing to fetch the batches before the first frame from (a listen-mode worker,
    an engine that only connects): they are unknown, as after a gap there."""
    engine = FakeEngine(replay=False)
    svc = RouterService(RouterSettings())
    await svc.start()
    try:
        sub = await subscribe(svc, engine)
        await engine.publish(batch(store_chain(0)), deliver=False)  # before we listened
        await engine.publish(batch(store_chain(1)))
        await wait_until(lambda: sub.last_seq.get(0) == 1, what="seq 1 applied")
        await assert_partial(svc, sub, 1)
        assert await hits(svc, "w0", 1) == 8
        # The engine starts over: nothing before is missing any more.
        await engine.publish(batch(AllBlocksCleared(), store_chain(2)))
        await wait_until(lambda: sub.last_seq.get(0) == 2, what="seq 2 applied")
        assert sub.partial_history is False
    finally:
        await svc.stop()
        await engine.close()


async def test_a_first_frame_at_seq_0_without_a_replay_endpoint_is_the_whole_history():
    engine = FakeEngine(replay=False)
    svc = RouterService(RouterSettings())
    await svc.start()
    try:
        sub = await subscribe(svc, engine)
        await engine.publish(batch(store_chain(0)))
        await wait_until(lambda: sub.last_seq.get(0) == 0, what="seq 0 applied")
        assert sub.partial_history is False
    finally:
        await svc.stop()
        await engine.close()


async def test_a_repair_that_cannot_reach_seq_0_leaves_the_history_partial(redis_url: str):
    """A failed index write is repaired by clearing the worker and replaying the
    publisher's buffer, which here no longer holds seq 0 (as in
    test_writer_repairs.py, the failure is a real WRONGTYPE, not a mock)."""
    engine = FakeEngine(buffer=2)
    svc = RouterService(RouterSettings(index="redis", redis_url=redis_url, replay_timeout_s=2))
    await svc.start()
    try:
        sub = await subscribe(svc, engine)
        for i in range(3):
            await engine.publish(batch(store_chain(i)))
        await wait_until(lambda: sub.last_seq.get(0) == 2, what="seqs 0..2 applied")
        assert not sub.partial_history
        client = redis.Redis.from_url(redis_url)
        client.delete(worker_prefix("w0") + "keys")
        client.set(worker_prefix("w0") + "keys", "not a set")  # WRONGTYPE for SADD
        await engine.publish(batch(store_chain(3)))
        await wait_until(lambda: sub.faulted, what="the worker marked faulted")
        client.delete(worker_prefix("w0") + "keys")
        await wait_until(lambda: not sub.faulted, what="the repair")
        # rebuilt from seqs 2 and 3 only: chains 0 and 1, still in the engine, unknown
        assert [await hits(svc, "w0", i) for i in (2, 3)] == [8, 8]
        await assert_partial(svc, sub, 0)
    finally:
        await svc.stop()
        await engine.close()


# ---------------------------------------------------------------- undecodable runs


async def test_a_run_of_undecodable_frames_costs_one_replay_and_shows_its_lag():
    """10 bad frames, a silent replay endpoint: one replay timeout, not ten, before the
    good batch after them is applied; meanwhile ``ingest_lag_s`` says it is waiting."""
    engine = FakeEngine(replay=False)
    try:
        async with silent_replay() as replay:
            svc, sub = await start(engine, replay, replay_timeout_s=1.0)
            try:
                await engine.publish(batch(store_chain(0)))
                await wait_until(lambda: sub.last_seq.get(0) == 0, what="seq 0 applied")
                replays = sub.counters.replays
                for _ in range(10):
                    await engine.publish_payload(GARBAGE)
                last = await engine.publish(batch(store_chain(1)))

                async def lagging() -> bool:
                    return (await svc.worker_info("w0")).ingest_lag_s >= 0.3

                await wait_until(lagging, what="ingest_lag_s while the replay waits")
                await wait_until(lambda: sub.last_seq.get(0) == last, what="good batch applied")
                assert sub.counters.replays - replays == 1
                assert sub.counters.decode_errors == 10
                assert await hits(svc, "w0", 1) == 8
                assert sub.lag_seconds() == 0.0
            finally:
                await svc.stop()
    finally:
        await engine.close()


async def test_undecodable_frames_at_the_tail_are_refetched_with_one_replay(engine: FakeEngine):
    """Corrupted in transit, good in the publisher's buffer, nothing after them: fetched
    once the stream goes quiet, with one replay for the run."""
    svc, sub = await start(engine)
    try:
        await engine.publish(batch(store_chain(0)))
        await wait_until(lambda: sub.last_seq.get(0) == 0, what="seq 0 applied")
        replays = sub.counters.replays
        for i in range(1, 6):
            seq = await engine.publish(batch(store_chain(i)), deliver=False)
            await engine.send_raw([engine.topic, seq.to_bytes(8, "big"), GARBAGE])
        await wait_until(lambda: sub.last_seq.get(0) == 5, what="good copies applied")
        assert sub.counters.replays - replays == 1
        assert sub.counters.decode_errors == 5
        assert [await hits(svc, "w0", i) for i in range(6)] == [8] * 6
    finally:
        await svc.stop()


# ---------------------------------------------------------------- log volume


async def test_gap_restart_and_resync_warnings_are_rate_limited(
    engine: FakeEngine, caplog: pytest.LogCaptureFixture
):
    """30 frames repeating seq 1 and 30 gaps the buffer cannot fill: every one counted,
    the first few of each kind logged. (30 rewinds this fast are two publishers on one
    topic, a conflict: test_publisher_conflict.py. Here each must stay a restart.)"""
    caplog.set_level(logging.WARNING, logger="router.ingest.subscription")
    svc, sub = await start(engine)
    sub._conflict = PublisherConflict(restarts=1_000)
    try:
        await engine.publish(batch(store_chain(0)))
        seq1 = await engine.publish(batch(store_chain(1)))
        await wait_until(lambda: sub.last_seq.get(0) == seq1, what="seq 1 applied")
        payload1 = dict(engine.buffer)[seq1]
        for _ in range(30):
            await engine.send_raw([engine.topic, seq1.to_bytes(8, "big"), payload1])
        await wait_until(lambda: sub.counters.resyncs == 30, what="30 restarts")
        for k in range(30):  # 3, 5, 7, ...: never buffered, so never replayable
            seq = 3 + 2 * k
            payload = dict(engine.buffer)[seq1]
            await engine.send_raw([engine.topic, seq.to_bytes(8, "big"), payload])
        await wait_until(lambda: sub.counters.gaps == 30, what="30 gaps")
        await wait_until(lambda: sub.counters.resyncs == 60, what="30 more resyncs")
        kinds = Counter(
            "restart" if "seq went back" in m else "gap" if ": gap " in m else "resync"
            for m in (r.getMessage() for r in caplog.records)
            if "seq went back" in m or ": gap " in m or "clearing its index" in m
        )
        assert kinds == {"restart": 5, "gap": 5, "resync": 5}, kinds
    finally:
        await svc.stop()


# ---------------------------------------------------------------- a refused message


async def test_a_batch_refused_for_its_size_and_replayed_after_the_reopen_is_a_gap(
    engine: FakeEngine,
):
    """The router connects: libzmq ends the session on the oversized message, the
    subscription connects again and its catch-up replay fetches the batch before any
    later frame could reveal the hole. docs/security.md: the batch is a gap."""
    svc, sub = await start(engine, sub_max_message_bytes=64 << 10)
    try:
        await engine.publish(batch(store_chain(0)))
        await wait_until(lambda: sub.last_seq.get(0) == 0, what="seq 0 applied")
        n = 40_000  # 10k blocks, ~200 KB of token ids in msgpack
        big = await engine.publish(batch(stored(list(range(1, n // 4 + 1)), [7] * n)))
        await wait_until(lambda: sub.counters.reopened == 1, what="connection reopened")
        await wait_until(lambda: sub.last_seq.get(0) == big, what="the batch replayed")
        assert sub.counters.gaps == 1 and sub.counters.resyncs == 0
        assert b'kvroute_gaps_total{worker="w0"} 1.0' in await svc.metrics.render()
    finally:
        await svc.stop()
