"""Audit of ``--listen``: one bad topic must not end the shared listener, and a worker
fed by it gets the same resync, repair and logging as one with its own socket."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import pytest
import zmq
import zmq.asyncio
from _helpers import wait_until

from publisher import ZmqEventPublisher
from router.config import RouterSettings, WorkerSpec
from router.ingest.listener import FedSubscription, TopicListener
from router.netutil import free_port
from router.service import RouterService
from schemas import BlockStored, KVEventBatch


def _store(i: int) -> KVEventBatch:
    toks = [i * 100 + k for k in range(8)]
    ev = BlockStored([i * 10 + 1, i * 10 + 2], None, toks, 4, None, "GPU", None)
    return KVEventBatch(float(i), [ev])


@pytest.fixture
async def listening() -> AsyncIterator[tuple[RouterService, str]]:
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    svc = RouterService(RouterSettings(listen=endpoint))
    await svc.start()
    yield svc, endpoint
    await svc.stop()


async def _fed(svc: RouterService, pub: ZmqEventPublisher, worker: str) -> FedSubscription:
    i = 0

    async def ingested() -> bool:
        nonlocal i
        pub.publish(_store(i))
        i += 1
        infos = {w.worker_id: w for w in await svc.worker_infos()}
        return worker in infos and infos[worker].events > 0

    await wait_until(ingested, f"worker {worker} created and ingested")
    sub = svc.subscriptions.get(worker)
    assert isinstance(sub, FedSubscription)
    return sub


def _listener(svc: RouterService) -> TopicListener:
    assert svc.listener is not None
    return svc.listener


async def test_a_model_too_long_for_a_spec_does_not_end_the_listener(
    listening: tuple[RouterService, str],
) -> None:
    svc, endpoint = listening
    ctx = zmq.asyncio.Context.instance()
    raw = ctx.socket(zmq.PUB)
    raw.connect(endpoint)
    pub = ZmqEventPublisher(endpoint, topic="kv@after")
    try:
        listener = _listener(svc)

        async def refused() -> bool:
            topic = b"kv@w@" + b"m" * 1000  # parses, yet no WorkerSpec takes it
            await raw.send_multipart([topic, (0).to_bytes(8, "big"), b"x"])
            return listener.unknown_topics > 0

        await wait_until(refused, "the long topic counted as unusable")
        await _fed(svc, pub, "after")  # the listener still serves every other engine
        assert "w" not in svc.subscriptions
        text = (await svc.metrics.render()).decode()
        assert f"kvroute_listener_unusable_frames_total {float(listener.unknown_topics)}" in text
        assert "kvroute_listener_dispatch_errors_total 0.0" in text
    finally:
        raw.close(linger=0)
        pub.shutdown()


async def test_a_resync_request_is_honoured_by_a_fed_worker(
    listening: tuple[RouterService, str],
) -> None:
    """The index watch asks every worker to resync when the index lost its content; a
    fed worker has no loop of its own, so the listener's feed must act on it."""
    svc, endpoint = listening
    pub = ZmqEventPublisher(endpoint, topic="kv@eng")
    try:
        sub = await _fed(svc, pub, "eng")
        before = sub.counters.resyncs
        sub.request_resync("the index lost its content")

        def resynced() -> bool:
            pub.publish(_store(50))
            return sub.counters.resyncs > before

        await wait_until(resynced, "the fed worker cleared and rebuilt")
        assert sub.partial_history  # no replay: what the engine cached before is unknown
    finally:
        pub.shutdown()


async def test_a_failed_write_marks_a_fed_worker_faulted(
    listening: tuple[RouterService, str],
) -> None:
    svc, endpoint = listening
    pub = ZmqEventPublisher(endpoint, topic="kv@eng")
    try:
        sub = await _fed(svc, pub, "eng")
        sub._writer.failed = True  # what IndexWriter.flush sets when a write fails

        def faulted() -> bool:
            pub.publish(_store(60))
            return sub.faulted

        await wait_until(faulted, "the failed write noticed and a repair scheduled")
    finally:
        pub.shutdown()


async def test_a_topic_naming_a_worker_with_its_own_socket_is_logged(
    listening: tuple[RouterService, str], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="router.ingest.listener")
    svc, endpoint = listening
    own = f"tcp://127.0.0.1:{free_port()}"
    await svc.add_worker(WorkerSpec(worker_id="own", endpoint=own, bind=True))
    pub = ZmqEventPublisher(endpoint, topic="kv@own")
    try:
        listener = _listener(svc)

        def counted() -> bool:
            pub.publish(_store(1))
            return listener.unknown_topics > 0

        await wait_until(counted, "the frame for a worker with its own socket counted")
        lines = [r.getMessage() for r in caplog.records if "own socket" in r.getMessage()]
        assert lines, [r.getMessage() for r in caplog.records]
    finally:
        pub.shutdown()
