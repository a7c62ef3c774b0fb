"""Both endpoint styles over real sockets, and a worker that never speaks.

vLLM (and our publisher, which follows it) binds its PUB only for ``*``/``::``/ipc/inproc
and *connects* for ``tcp://host:port``: the router must then bind. A worker registered
the wrong way round stays silent, and the router says so.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import pytest
from _helpers import wait_until

from publisher import ZmqEventPublisher
from router.config import RouterSettings, WorkerSpec
from router.ingest.listener import parse_topic
from router.netutil import InvalidEndpoint, free_port
from router.service import RouterService
from schemas import BlockStored, KVEventBatch


@pytest.fixture
async def service() -> AsyncIterator[RouterService]:
    svc = RouterService(RouterSettings(silent_after_s=0.5))
    await svc.start()
    yield svc
    await svc.stop()


def _store(i: int) -> KVEventBatch:
    toks = [i * 100 + k for k in range(8)]
    ev = BlockStored([i * 10 + 1, i * 10 + 2], None, toks, 4, None, "GPU", None)
    return KVEventBatch(float(i), [ev])


async def test_router_binds_and_a_connecting_engine_is_ingested(service: RouterService) -> None:
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    await service.add_worker(WorkerSpec(worker_id="w", endpoint=endpoint, bind=True))
    pub = ZmqEventPublisher(endpoint)  # connects: a host and port, like vLLM
    try:
        sub = service.subscriptions.get("w")
        assert sub is not None
        await wait_until(lambda: sub.state == "connected", "engine connected to our SUB")
        # PUB/SUB may drop what is sent before the subscription reaches the engine.
        sent: list[int] = []

        async def ingested() -> bool:
            sent.append(len(sent) + 1)
            pub.publish(_store(sent[-1]))
            return (await service.worker_info("w")).events > 0

        await wait_until(ingested, "a store published by a connecting engine")
        scores = [
            (await service.score([i * 100 + k for k in range(9)], ["w"])).workers[0].hit_tokens
            for i in sent
        ]
        assert 8 in scores
        info = await service.worker_info("w")
        assert info.silent is False and info.events >= 1
    finally:
        pub.shutdown()


async def test_bind_to_a_busy_port_is_an_invalid_endpoint(service: RouterService) -> None:
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    await service.add_worker(WorkerSpec(worker_id="a", endpoint=endpoint, bind=True))
    with pytest.raises(InvalidEndpoint):
        await service.add_worker(WorkerSpec(worker_id="b", endpoint=endpoint, bind=True))


async def test_both_sides_connecting_is_reported_silent(service: RouterService) -> None:
    """Router and engine both connect: nothing ever flows. Status, metrics and a log
    line say so once ``silent_after_s`` has passed."""
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    pub = ZmqEventPublisher(endpoint)  # connects too
    try:
        await service.add_worker(WorkerSpec(worker_id="w", endpoint=endpoint))
        pub.publish(_store(1))

        async def silent() -> bool:
            return (await service.worker_info("w")).silent

        await wait_until(silent, "worker flagged silent")
        from prometheus_client import generate_latest

        text = generate_latest(service.metrics.registry).decode()
        assert 'kvroute_worker_silent{worker="w"} 1.0' in text
    finally:
        pub.shutdown()


def test_topics_name_workers() -> None:
    assert parse_topic(b"kv@10.0.0.5@meta-llama/Llama-3.1-8B") == (
        "10.0.0.5",
        "meta-llama/Llama-3.1-8B",
    )
    assert parse_topic(b"kv@eng-1") == ("eng-1", None)
    assert parse_topic(b"kv@") is None and parse_topic(b"other@x") is None
    assert parse_topic(b"kv@bad id") is None and parse_topic(b"\xff") is None


async def test_one_listener_for_a_fleet_that_connects() -> None:
    """llm-d's deployment: every engine connects to one bound SUB, topic names it."""
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    svc = RouterService(RouterSettings(listen=endpoint))
    await svc.start()
    pubs = [
        ZmqEventPublisher(endpoint, topic="kv@10.0.0.5@llama"),
        ZmqEventPublisher(endpoint, topic="kv@eng1"),
    ]
    try:
        i = 0

        async def both_ingested() -> bool:
            nonlocal i
            i += 1
            for pub in pubs:
                pub.publish(_store(i))
            infos = {w.worker_id: w for w in await svc.worker_infos()}
            return all(infos.get(w) and infos[w].events > 0 for w in ("10.0.0.5", "eng1"))

        await wait_until(both_ingested, "both engines' workers created and ingested")
        info = await svc.worker_info("10.0.0.5")
        assert (info.model, info.state, info.topic) == ("llama", "connected", "kv@10.0.0.5@llama")
        assert svc.listener is not None and svc.listener.unknown_topics == 0
    finally:
        for pub in pubs:
            pub.shutdown()
        await svc.stop()


async def test_wrong_topic_is_reported_silent(service: RouterService) -> None:
    """Registered with a topic the engine does not publish: connected, yet every frame
    is filtered out by the SUB socket. Shown as ``silent`` instead of a quiet worker."""
    pub = ZmqEventPublisher("tcp://127.0.0.1:*", topic="kv@engine-a")
    try:
        assert pub.bound_endpoint is not None
        spec = WorkerSpec(worker_id="w", endpoint=pub.bound_endpoint, topic="kv@engine-b")
        await service.add_worker(spec)
        sub = service.subscriptions.get("w")
        assert sub is not None
        await wait_until(lambda: sub.connected, "connected")

        async def silent() -> bool:
            pub.publish(_store(1))  # keeps publishing; none of it matches the topic
            return (await service.worker_info("w")).silent

        await wait_until(silent, "worker flagged silent")
        info = await service.worker_info("w")
        assert info.state == "connected" and info.events == 0
    finally:
        pub.shutdown()


async def test_unusable_topics_keep_being_logged(caplog: pytest.LogCaptureFixture) -> None:
    """An engine publishing under a topic that names no worker: counted, and logged
    for as long as it lasts (rate-limited with counts), not once per topic forever."""
    caplog.set_level(logging.WARNING, logger="router.ingest.listener")
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    svc = RouterService(RouterSettings(listen=endpoint))
    await svc.start()
    pub = ZmqEventPublisher(endpoint, topic="kv@bad id")
    try:
        listener = svc.listener
        assert listener is not None

        def three() -> bool:
            pub.publish(_store(1))
            return listener.unknown_topics >= 3

        await wait_until(three, "three frames with an unusable topic")
        lines = [r.getMessage() for r in caplog.records if "unusable topic" in r.getMessage()]
        assert len(lines) >= 3 and "(3 so far)" in lines[2], lines
        assert await svc.worker_infos() == []
    finally:
        pub.shutdown()
        await svc.stop()
