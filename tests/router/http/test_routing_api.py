"""``/v1/route`` and ``/v1/requests/{id}/finish`` over the real app, fed over real ZMQ.

Two workers publish through real ``ZmqEventPublisher`` sockets the events of the engine
cache model (``KVCacheManager``); the router subscribes, and routes over HTTP (uvicorn).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx
import pytest
from _helpers import free_port, serve_app, wait_until

from offload_core.kv_cache import KVCacheManager
from publisher.zmq_publisher import ZmqEventPublisher
from router.config import RouterSettings, WorkerSpec
from router.http.app import create_app
from router.http.routing import reset_routing
from router.service import RouterService
from schemas import KVEventBatch
from schemas.hit_rule import GroupSpec

BS = 16


@dataclass
class Worker:
    worker_id: str
    kv: KVCacheManager
    pub: ZmqEventPublisher

    def serve(self, tokens: list[int]) -> None:
        """What an engine does for a prompt: cache it and publish the events."""
        self.kv.process(tokens)
        self.pub.publish(KVEventBatch(ts=time.time(), events=self.kv.pool.take_events()))


@dataclass
class Env:
    client: httpx.AsyncClient
    service: RouterService
    workers: dict[str, Worker]


@pytest.fixture
async def env() -> AsyncIterator[Env]:
    workers: dict[str, Worker] = {}
    for wid in ("a", "b"):
        pub = ZmqEventPublisher(
            "tcp://127.0.0.1:*", replay_endpoint="tcp://127.0.0.1:*", topic=f"kv@{wid}"
        )
        workers[wid] = Worker(wid, KVCacheManager([GroupSpec("full_attention", BS)], 256), pub)
    specs = [
        WorkerSpec(
            worker_id=w.worker_id,
            endpoint=w.pub.bound_endpoint or "",
            replay_endpoint=w.pub.bound_replay_endpoint,
            http_endpoint=f"http://engine-{w.worker_id}:8100",
        )
        for w in workers.values()
    ]
    service = RouterService(RouterSettings(workers=specs))
    try:
        async with serve_app(create_app(service)) as client:
            yield Env(client, service, workers)
    finally:
        for w in workers.values():
            w.pub.shutdown()


async def cache_on(env: Env, worker_id: str, tokens: list[int]) -> None:
    """Serve ``tokens`` on a worker and wait until the router has indexed the prefix
    (a batch sent before the router's SUB joined arrives through the replay socket)."""
    expected = (len(tokens) // BS) * BS
    probe = [*tokens, 1]
    env.workers[worker_id].serve(tokens)

    async def indexed() -> bool:
        r = await env.client.post("/v1/score", json={"token_ids": probe, "workers": [worker_id]})
        return bool(r.json()["workers"][0]["hit_tokens"] >= expected)

    await wait_until(indexed, what=f"{worker_id} indexed")


async def route(env: Env, tokens: list[int], **extra: object) -> httpx.Response:
    return await env.client.post("/v1/route", json={"token_ids": tokens, **extra})


async def test_route_prefers_the_cached_worker_and_counts_it(env: Env) -> None:
    prefix = list(range(1000, 1000 + 8 * BS))
    await cache_on(env, "b", prefix)
    r = await route(env, [*prefix, 5, 6, 7], request_id="req-1")
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["request_id"] == "req-1"
    assert body["worker_id"] == "b"
    assert body["endpoint"] == "http://engine-b:8100"
    assert body["hit_tokens"] == 8 * BS
    cands = body["candidates"]
    assert [c["worker_id"] for c in cands] == ["b", "a"]  # chosen first
    assert cands[0]["hit_tokens"] == 8 * BS and cands[1]["hit_tokens"] == 0
    assert cands[0]["cost"] < cands[1]["cost"]
    # It is now load on b until finished; the dashboard sees the decision.
    core = env.service.routing  # type: ignore[attr-defined]
    assert core.inflight.load("b").requests == 1
    last = env.service.recent_routes[-1]
    assert {k: last[k] for k in ("request_id", "worker_id", "hit_tokens", "policy")} == {
        "request_id": "req-1",
        "worker_id": "b",
        "hit_tokens": 8 * BS,
        "policy": "kv_aware",
    }
    assert last["request_tokens"] == 8 * BS + 3 and last["ts"] > 0
    # A duplicate id while in flight is refused; finish ends it exactly once.
    dup = await route(env, prefix, request_id="req-1")
    assert dup.status_code == 409 and dup.json()["error"]["code"] == "duplicate_request"
    done = await env.client.post("/v1/requests/req-1/finish")
    assert done.status_code == 204 and core.inflight.load("b").requests == 0
    again = await env.client.post("/v1/requests/req-1/finish")
    assert again.status_code == 404 and again.json()["error"]["code"] == "unknown_request"
    metrics = (await env.client.get("/metrics")).text
    assert 'kvroute_routes_total{policy="kv_aware"} 1.0' in metrics
    assert "kvroute_route_finished_total 1.0" in metrics


async def test_load_spreads_requests_when_nothing_is_cached(env: Env) -> None:
    first = (await route(env, list(range(64)), request_id="x1")).json()
    second = (await route(env, list(range(500, 564)), request_id="x2")).json()
    assert first["worker_id"] != second["worker_id"]  # in-flight load, not a coin toss
    generated = (await route(env, [9] * 40)).json()
    assert len(generated["request_id"]) >= 16  # an id is generated when none is given


async def test_baselines_by_name(env: Env) -> None:
    prefix = list(range(3000, 3000 + 4 * BS))
    await cache_on(env, "a", prefix)
    seen = [
        (await route(env, [*prefix, i], policy="round_robin")).json()["worker_id"] for i in range(4)
    ]
    assert seen in (["a", "b", "a", "b"], ["b", "a", "b", "a"])
    for i in range(3):  # longest_prefix ignores the load it piles onto a
        r = await route(env, [*prefix, 100 + i], policy="longest_prefix")
        assert r.json()["worker_id"] == "a"
    r = await route(env, [*prefix, 7], policy="least_loaded")
    # The kv_aware load term alone: a carries 5 in-flight requests (all hits), b 2 whose
    # prompts are still to be prefilled; whichever weighs less wins, hits ignored.
    loads = {c["worker_id"]: c["load"] for c in r.json()["candidates"]}
    lighter = min(loads, key=loads.__getitem__)
    assert loads["a"] != loads["b"] and r.json()["worker_id"] == lighter
    # A prompt cached only on the busier worker still goes to the lighter one (loads
    # read from this decision: backlogs drain in wall time between the two).
    other = list(range(9000, 9000 + 4 * BS))
    await cache_on(env, "b" if lighter == "a" else "a", other)
    r = await route(env, [*other, 1], policy="least_loaded")
    loads = {c["worker_id"]: c["load"] for c in r.json()["candidates"]}
    assert r.json()["worker_id"] == min(loads, key=loads.__getitem__)


async def test_route_errors_are_json(env: Env) -> None:
    r = await route(env, [1, 2, 3], policy="fastest")
    assert r.status_code == 422 and r.json()["error"]["code"] == "unknown_policy"
    r = await route(env, [1, 2, 3], workers=["nope"])
    assert r.status_code == 404 and r.json()["error"]["code"] == "unknown_worker"
    # An empty candidate list is the caller's mistake, not a fleet without workers.
    r = await route(env, [1, 2, 3], workers=[])
    assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_request"
    assert "empty" in r.json()["error"]["message"]
    r = await env.client.post("/v1/route", json={"token_ids": ["x"]})
    assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_request"
    limit = env.service.settings.max_request_tokens
    r = await route(env, [1] * (limit + 1))
    assert r.status_code == 413
    # Restricting the candidates works and is honoured.
    r = await route(env, [1, 2, 3], workers=["b"])
    assert r.status_code == 200 and r.json()["worker_id"] == "b"
    assert [c["worker_id"] for c in r.json()["candidates"]] == ["b"]


async def test_no_workers_registered_is_503() -> None:
    async with serve_app(create_app(RouterService(RouterSettings()))) as client:
        r = await client.post("/v1/route", json={"token_ids": [1, 2]})
        assert r.status_code == 503 and r.json()["error"]["code"] == "no_workers"
        r = await client.post("/v1/requests/none/finish")
        assert r.status_code == 404


async def test_route_settings_pick_the_default_policy_and_weights() -> None:
    settings = RouterSettings(
        workers=[WorkerSpec(worker_id="solo", endpoint=f"tcp://127.0.0.1:{free_port()}")],
        route_policy="least_loaded",
        route_weights={"decode": 7.0},
        route_inflight_ttl_s=30.0,
    )
    service = RouterService(settings)
    async with serve_app(create_app(service)) as client:
        r = await client.post("/v1/route", json={"token_ids": [1, 2, 3]})
        assert r.status_code == 200 and r.json()["worker_id"] == "solo"
        assert r.json()["endpoint"] is None  # registered without an http endpoint
        core = service.routing  # type: ignore[attr-defined]
        assert core.config.default_policy == "least_loaded"
        assert core.config.weights.decode == 7.0 and core.inflight.ttl == 30.0
        assert service.recent_routes[-1]["policy"] == "least_loaded"
        assert r.json()["candidates"][0]["load"] == 0.0  # the load before this request


async def test_an_engine_cache_reset_ends_its_share_of_recent_requests(env: Env) -> None:
    # The listener reaches the current core: reset_routing replaces it (kvroute demo).
    core = reset_routing(env.service)
    prefix = list(range(5000, 5000 + 4 * BS))
    await cache_on(env, "a", prefix)
    for i in range(4):  # a cache-blind burst onto a
        r = await route(env, [*prefix, i], policy="longest_prefix")
        assert r.json()["worker_id"] == "a"
    assert (await route(env, [7] * 40, workers=["b"])).json()["worker_id"] == "b"
    b_share = core.recent["b"]
    assert core.recent["a"] > b_share > 0 and core.routed_total == 5
    # Engine a resets its prefix cache (vLLM's /reset_prefix_cache) and publishes it.
    a = env.workers["a"]
    assert a.kv.reset()
    a.pub.publish(KVEventBatch(ts=time.time(), events=a.kv.pool.take_events()))
    await wait_until(lambda: core.recent["a"] == 0.0, what="a's share forgotten")
    assert core.recent["b"] == b_share and core.routed_total == 5  # b still holds its part
    # Then b: every engine reset with nothing routed since, the warm-up starts over.
    b = env.workers["b"]
    assert b.kv.reset()
    b.pub.publish(KVEventBatch(ts=time.time(), events=b.kv.pool.take_events()))
    await wait_until(lambda: core.recent["b"] == 0.0, what="b's share forgotten")
    assert core.routed_total == 0
    assert env.service.ingestor.counters.events_cleared == 2
