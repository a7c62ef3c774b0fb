"""A refused worker registration leaves nothing behind (issue: anyone could grow the
index's worker table, the ``kvroute_index_workers`` gauge and the per-id lock table
without bound by posting fresh ids that are then refused).

Each refusal -- 409 ``too_many_workers``, 403 ``endpoint_not_allowed``, 422
``invalid_endpoint`` (also a bind to a port in use, only known once the subscription
binds, after the settings were saved) -- is repeated with fresh ids over real HTTP, on
the memory index and on a real Redis; the index's workers, the gauge, the lock table and
(Redis) the database's keys must be as before. So must they after two registrations
racing for the last ``max_workers`` slot, and after the shared listener was refused a
worker for a new topic (which used to end the listener's task).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import redis
from _helpers import batch, hits, serve_app, store_chain, wait_until

from publisher import ZmqEventPublisher
from router.config import RouterSettings, WorkerSpec
from router.http import create_app
from router.netutil import free_port, listen_socket
from router.service import RouterService, TooManyWorkers

REFUSALS = 20

# (settings, the refused body for id N, status, code)
CASES: dict[str, tuple[dict[str, Any], dict[str, Any], int, str]] = {
    "too_many_workers": (
        {"max_workers": 1},
        {"endpoint": "tcp://127.0.0.1:1"},
        409,
        "too_many_workers",
    ),
    "endpoint_not_allowed": (
        {"worker_allow": ["127.0.0.0/8"]},
        {"endpoint": "tcp://192.168.7.7:1"},
        403,
        "endpoint_not_allowed",
    ),
    "invalid_endpoint": ({}, {"endpoint": "tcp://127.0.0.1:\u0661\u0662"}, 422, "invalid_endpoint"),
    "invalid_replay_endpoint": (
        {},
        {"endpoint": "tcp://127.0.0.1:1", "replay_endpoint": "tcp://127.0.0.1:\u0661\u0662"},
        422,
        "invalid_endpoint",
    ),
    "bind_to_a_port_in_use": ({}, {"endpoint": "BUSY", "bind": True}, 422, "invalid_endpoint"),
}


@pytest.fixture
def busy_endpoint() -> Iterator[str]:
    """A loopback TCP endpoint some other socket listens on (a bind there fails)."""
    sock = listen_socket()
    sock.listen()
    try:
        yield f"tcp://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        sock.close()


async def _index_workers_gauge(c: httpx.AsyncClient) -> float:
    text = (await c.get("/metrics")).text
    for line in text.splitlines():
        if line.startswith("kvroute_index_workers "):
            return float(line.split()[1])
    raise AssertionError(f"no kvroute_index_workers in /metrics:\n{text}")


async def _snapshot(c: httpx.AsyncClient, svc: Any, db: redis.Redis | None) -> dict[str, Any]:
    stats = (await c.get("/v1/index/stats")).json()
    return {
        "index_workers": stats["workers"],
        "registered": stats["registered_workers"],
        "gauge": await _index_workers_gauge(c),
        "locks": len(svc.registry.locks),
        "known": await svc.index.known_workers(),
        # Per-worker keys (the slot allocator's counters may move: a refusal found only
        # once the subscription binds gives its slot back, for the next worker to reuse).
        "redis_keys": sorted(k for k in db.keys("*") if b":w:" in k) if db is not None else None,
    }


@pytest.mark.parametrize("index", ["memory", "redis"])
@pytest.mark.parametrize("case", list(CASES))
async def test_a_refused_registration_leaves_no_state(
    index: str, case: str, busy_endpoint: str, request: pytest.FixtureRequest
) -> None:
    settings, refused, status, code = CASES[case]
    if refused["endpoint"] == "BUSY":
        refused = {**refused, "endpoint": busy_endpoint}
    db: redis.Redis | None = None
    extra: dict[str, Any] = {}
    if index == "redis":
        url = request.getfixturevalue("redis_url")
        db = redis.Redis.from_url(url)
        extra = {"index": "redis", "redis_url": url}
    app = create_app(settings=RouterSettings(replay_timeout_s=1.0, **settings, **extra))
    svc = app.state.service
    async with serve_app(app) as c:
        ok = await c.post("/v1/workers", json={"worker_id": "w0", "endpoint": "tcp://127.0.0.1:1"})
        assert ok.status_code == 201, ok.text
        before = await _snapshot(c, svc, db)
        assert before["index_workers"] == 1 and before["gauge"] == 1.0, before
        for i in range(REFUSALS):
            r = await c.post("/v1/workers", json={"worker_id": f"z{i}", **refused})
            assert r.status_code == status, r.text
            assert r.json()["error"]["code"] == code, r.text
        assert await _snapshot(c, svc, db) == before
        # The refused ids stay usable, and a registration and removal leave no lock.
        r = await c.post("/v1/workers", json={"worker_id": "w0", "endpoint": "tcp://127.0.0.1:1"})
        assert r.status_code == 409 and r.json()["error"]["code"] == "worker_exists", r.text
        assert (await c.delete("/v1/workers/w0")).status_code == 204
        assert len(svc.registry.locks) == 0


async def test_registrations_racing_for_the_last_slot_leave_no_state(redis_url: str) -> None:
    """Both pass the up-front checks; the loser is refused after its settings were saved
    in Redis (the winner registered meanwhile) and must take them back out."""
    svc = RouterService(RouterSettings(index="redis", redis_url=redis_url, max_workers=2))
    await svc.start()
    try:
        await svc.add_worker(WorkerSpec(worker_id="w0", endpoint="tcp://127.0.0.1:1"))
        specs = [WorkerSpec(worker_id=f"z{i}", endpoint="tcp://127.0.0.1:2") for i in range(2)]
        got = await asyncio.gather(*(svc.add_worker(s) for s in specs), return_exceptions=True)
        refused = [g for g in got if isinstance(g, BaseException)]
        assert len(refused) == 1 and isinstance(refused[0], TooManyWorkers), got
        assert await svc.index.known_workers() == sorted(svc.worker_ids())
        assert (await svc.index.stats())["workers"] == 2
        assert len(svc.registry.locks) == 0
    finally:
        await svc.stop()


async def test_a_listener_topic_beyond_max_workers_is_refused_and_the_listener_lives_on() -> None:
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    svc = RouterService(RouterSettings(listen=endpoint, max_workers=1))
    await svc.start()
    pubs = [ZmqEventPublisher(endpoint, topic=f"kv@{w}") for w in ("a", "b")]
    try:
        listener = svc.listener
        assert listener is not None

        async def a_indexed(i: int) -> bool:
            pubs[0].publish(batch(store_chain(i)))
            return "a" in svc.worker_ids() and await hits(svc, "a", i) == 8

        await wait_until(lambda: a_indexed(0), what="worker a adopted and indexed")

        def b_refused() -> bool:
            pubs[1].publish(batch(store_chain(5)))
            return listener.unknown_topics >= 3

        await wait_until(b_refused, what="worker b refused (max_workers)")
        await wait_until(lambda: a_indexed(1), what="the listener still feeds worker a")
        assert svc.worker_ids() == ["a"]
        assert (await svc.index.stats())["workers"] == 1
        assert len(svc.registry.locks) == 0
    finally:
        for pub in pubs:
            pub.shutdown()
        await svc.stop()
