"""Issue 14 (API side) over real HTTP: validation at the boundary, bounded bodies however
they are sent, one auth rule, and the worker-registration guards."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import zmq
from _helpers import FakeEngine, batch, serve_app, stored, wait_seq, wait_until

from router.config import RouterSettings
from router.http import create_app
from router.http.deps import require_read_key, require_write_key
from router.netutil import free_port

KEY = "k3y"


def app_for(**settings: Any) -> Any:
    return create_app(settings=RouterSettings(replay_timeout_s=1.0, **settings))


def assert_error(r: httpx.Response, status: int, code: str | None = None) -> dict[str, Any]:
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error"}, body
    assert set(body["error"]) == {"code", "message", "type", "param"}, body
    if code is not None:
        assert body["error"]["code"] == code, body
    return body["error"]  # type: ignore[no-any-return]


@pytest.fixture
async def engine() -> AsyncIterator[FakeEngine]:
    eng = FakeEngine()
    yield eng
    await eng.close()


# ------------------------------------------------------------------ token ids and strings
BAD_TOKEN_LISTS = [
    [],  # every engine rejects an empty prompt
    [-1],
    [1, 2, -(2**63)],
    [2**63],  # beyond int64
    [2**64],  # used to reach the chain encoder: OverflowError -> 500
    [0, 2**64 + 5],
    [-(2**63) - 1],
]


@pytest.mark.parametrize("tokens", BAD_TOKEN_LISTS)
async def test_out_of_range_token_ids_are_422_on_score_and_route(
    engine: FakeEngine, tokens: list[int]
):
    async with serve_app(app_for()) as c:
        assert (await c.post("/v1/workers", json=engine.spec("w0"))).status_code == 201
        await engine.wait_subscribed()
        await engine.publish(batch(stored([1, 2], list(range(8)))))  # learns block size 4
        await wait_seq(c, "w0", 0)
        for path in ("/v1/score", "/v1/route"):
            err = assert_error(await c.post(path, json={"token_ids": tokens}), 422)
            assert "token_ids" in err["message"], err
        ok = await c.post("/v1/score", json={"token_ids": [0, 2**63 - 1, 5, 6]})
        assert ok.status_code == 200, ok.text


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/score", {"token_ids": [1], "lora_name": "x" * 10_000}),
        ("/v1/score", {"token_ids": [1], "cache_salt": "s" * 10_000}),
        ("/v1/score", {"token_ids": [1], "workers": ["w" * 1000]}),
        ("/v1/route", {"token_ids": [1], "lora_name": "x" * 10_000}),
        ("/v1/route", {"token_ids": [1], "policy": "p" * 10_000}),
        ("/v1/route", {"token_ids": [1], "request_id": ""}),
        ("/v1/workers", {"worker_id": "w", "endpoint": "tcp://127.0.0.1:5", "model": "m" * 10**6}),
        ("/v1/workers", {"worker_id": "w", "endpoint": "tcp://127.0.0.1:5", "topic": "t" * 4096}),
        ("/v1/workers", {"worker_id": "w" * 200, "endpoint": "tcp://127.0.0.1:5"}),
    ],
)
async def test_string_fields_are_bounded(path: str, body: dict[str, Any]):
    async with serve_app(app_for()) as c:
        assert_error(await c.post(path, json=body), 422)
        assert (await c.get("/v1/workers")).json()["workers"] == []


# ------------------------------------------------------------------ bodies however sent
async def test_chunked_bodies_are_bounded_like_content_length_ones():
    async with serve_app(app_for(max_request_tokens=64)) as c:
        limit = 64 * 12 + (1 << 20)
        big = b'{"token_ids": [' + b"1," * (limit // 2) + b"1]}"

        async def chunks(data: bytes, size: int = 65536) -> AsyncIterator[bytes]:
            for i in range(0, len(data), size):
                yield data[i : i + size]

        # Declared length: refused up front (as before).
        r = await c.post("/v1/score", content=big, headers={"content-type": "application/json"})
        assert_error(r, 413, "payload_too_large")
        # No Content-Length (Transfer-Encoding: chunked): refused as well, not parsed.
        r = await c.post("/v1/score", content=chunks(big))
        assert r.request.headers.get("transfer-encoding") == "chunked"
        assert_error(r, 413, "payload_too_large")
        # A small chunked body still works end to end.
        small = b'{"token_ids": [1, 2, 3]}'
        r = await c.post("/v1/score", content=chunks(small, 4))
        assert r.status_code == 200, r.text
        r = await c.post("/v1/workers", content=chunks(b'{"worker_id": "w"}', 3))
        assert_error(r, 422)


# ------------------------------------------------------------------ endpoints
@pytest.mark.parametrize(
    "endpoint",
    [
        "tcp://127.0.0.1:0",
        "tcp://256.0.0.1:5",
        "tcp://:5",
        "tcp://[::1",
        "inproc://x",
        "tcp://127.0.0.1:65536",
        "tcp://127.0.0.1:abc",
        "tcp://127.0.0.1",
        "tcp://0.0.0.0:5557",
        "tcp://bad_host!:5",
        "pgm://eth0;239.192.1.1:5555",
        "tcp://127.0.0.1:5;10.0.0.1:6",
    ],
)
async def test_unusable_endpoints_are_422(endpoint: str):
    async with serve_app(app_for()) as c:
        for body in (
            {"worker_id": "w", "endpoint": endpoint},
            {"worker_id": "w", "endpoint": "tcp://127.0.0.1:5", "replay_endpoint": endpoint},
        ):
            assert_error(await c.post("/v1/workers", json=body), 422)
        assert (await c.get("/v1/workers")).json()["workers"] == []


@pytest.mark.parametrize("url", ["ftp://h/x", "http://", "http://u:p@h:1", "http://h:0", "h:80"])
async def test_bad_http_endpoints_are_422(url: str):
    async with serve_app(app_for()) as c:
        body = {"worker_id": "w", "endpoint": "tcp://127.0.0.1:5", "http_endpoint": url}
        assert_error(await c.post("/v1/workers", json=body), 422)


@pytest.mark.parametrize(
    "endpoint",
    ["tcp://10.0.0.5:5557", "tcp://engine-1.gpu.internal:5557", "tcp://[::1]:5557", "ipc:///tmp/x"],
)
async def test_good_endpoints_are_accepted(endpoint: str):
    async with serve_app(app_for()) as c:
        r = await c.post("/v1/workers", json={"worker_id": "w", "endpoint": endpoint})
        assert r.status_code == 201, r.text


async def test_worker_allow_list():
    allow = ["127.0.0.0/8", "*.gpu.internal"]
    async with serve_app(app_for(worker_allow=allow)) as c:
        ok = {
            "worker_id": "a",
            "endpoint": "tcp://127.0.0.1:5",
            "http_endpoint": "http://127.0.0.1:1",
        }
        assert (await c.post("/v1/workers", json=ok)).status_code == 201
        ok2 = {"worker_id": "b", "endpoint": "tcp://e1.gpu.internal:5"}
        assert (await c.post("/v1/workers", json=ok2)).status_code == 201
        for body in (
            {"worker_id": "c", "endpoint": "tcp://10.1.2.3:5"},
            {"worker_id": "c", "endpoint": "tcp://evil.example:5"},
            {
                "worker_id": "c",
                "endpoint": "tcp://127.0.0.1:5",
                "replay_endpoint": "tcp://10.0.0.1:6",
            },
            {"worker_id": "c", "endpoint": "tcp://127.0.0.1:5", "http_endpoint": "http://10.9.9.9"},
            {"worker_id": "c", "endpoint": "ipc:///tmp/sock"},
        ):
            assert_error(await c.post("/v1/workers", json=body), 403, "endpoint_not_allowed")
        ids = [w["worker_id"] for w in (await c.get("/v1/workers")).json()["workers"]]
        assert ids == ["a", "b"]


def test_worker_allow_entries_are_checked():
    with pytest.raises(ValueError, match="not-a-cidr/99"):
        RouterSettings(worker_allow="10.0.0.0/8,not-a-cidr/99")
    assert RouterSettings(worker_allow="10.0.0.0/8, gpu-1").worker_allow == ["10.0.0.0/8", "gpu-1"]


async def test_max_workers():
    async with serve_app(app_for(max_workers=2)) as c:
        for i in range(2):
            body = {"worker_id": f"w{i}", "endpoint": f"tcp://127.0.0.1:{i + 1}"}
            assert (await c.post("/v1/workers", json=body)).status_code == 201
        body = {"worker_id": "w2", "endpoint": "tcp://127.0.0.1:3"}
        assert_error(await c.post("/v1/workers", json=body), 409, "too_many_workers")
        assert (await c.delete("/v1/workers/w0")).status_code == 204
        assert (await c.post("/v1/workers", json=body)).status_code == 201


async def test_socket_exhaustion_at_registration_is_503_not_500():
    app = app_for()
    # A tiny socket budget, set before the context opens its first socket.
    app.state.service.subscriptions._ctx.set(zmq.MAX_SOCKETS, 8)
    async with serve_app(app) as c:
        statuses = []
        for i in range(6):
            body = {"worker_id": f"w{i}", "endpoint": f"tcp://127.0.0.1:{i + 1}"}
            statuses.append((await c.post("/v1/workers", json=body)).status_code)
        assert 201 in statuses and statuses[-1] == 503, statuses
        r = await c.post("/v1/workers", json={"worker_id": "x", "endpoint": "tcp://127.0.0.1:9"})
        assert_error(r, 503, "sockets_exhausted")
        assert r.headers["retry-after"]
        # Nothing leaked: deleting one worker frees room for another (ZMQ frees a closed
        # socket's slot in its reaper thread, so the retry may take a moment).
        registered = [w["worker_id"] for w in (await c.get("/v1/workers")).json()["workers"]]
        assert (await c.delete(f"/v1/workers/{registered[0]}")).status_code == 204

        async def retry() -> bool:
            body = {"worker_id": "x", "endpoint": "tcp://127.0.0.1:9"}
            return (await c.post("/v1/workers", json=body)).status_code == 201

        await wait_until(retry, what="registration after a delete")


# ------------------------------------------------------------------ auth
async def test_route_and_finish_need_the_key_alike(engine: FakeEngine):
    """A client that may route (add load) may also finish (release it): both need the key."""
    async with serve_app(app_for(api_key=KEY)) as c:
        h = {"Authorization": f"Bearer {KEY}"}
        assert (await c.post("/v1/workers", json=engine.spec("w0"), headers=h)).status_code == 201
        body = {"token_ids": [1, 2, 3], "request_id": "r1"}
        assert_error(await c.post("/v1/route", json=body), 401, "unauthorized")
        assert (await c.post("/v1/route", json=body, headers=h)).status_code == 200
        assert_error(await c.post("/v1/requests/r1/finish"), 401, "unauthorized")
        assert (await c.post("/v1/requests/r1/finish", headers=h)).status_code == 204
        # Reads stay open without api_key_all.
        assert (await c.post("/v1/score", json={"token_ids": [1]})).status_code == 200
        assert (await c.get("/v1/workers/w0")).status_code == 200


async def test_api_key_all_covers_every_v1_read():
    async with serve_app(app_for(api_key=KEY, api_key_all=True)) as c:
        h = {"X-API-Key": KEY}
        for path in ("/v1/workers", "/v1/workers/nope", "/v1/index/stats"):
            assert_error(await c.get(path), 401)
        assert (await c.get("/v1/workers", headers=h)).status_code == 200
        assert (await c.get("/v1/index/stats", headers=h)).status_code == 200
        assert_error(await c.get("/v1/workers/nope", headers=h), 404)
        # Probes and metrics stay open for orchestrators and Prometheus.
        for path in ("/healthz", "/readyz", "/metrics"):
            assert (await c.get(path)).status_code == 200


def _all_routes(routes: list[Any]) -> list[Any]:
    """Every route, through included routers (FastAPI may keep those as wrappers)."""
    out = []
    for r in routes:
        inner = getattr(r, "original_router", None)
        out.extend(_all_routes(inner.routes) if inner is not None else [r])
    return out


def _dependency_calls(route: Any) -> set[Any]:
    out, stack = set(), [route.dependant]
    while stack:
        dep = stack.pop()
        out.add(dep.call)
        stack.extend(dep.dependencies)
    return out


def test_every_v1_endpoint_declares_its_auth_class():
    """The rule is structural: a new /v1 endpoint must say whether it reads or writes."""
    from fastapi.routing import APIRoute

    app = app_for()
    writes = {
        ("POST", "/v1/workers"),
        ("DELETE", "/v1/workers/{worker_id}"),
        ("POST", "/v1/route"),
        ("POST", "/v1/requests/{request_id:path}/finish"),
    }
    seen = set()
    for route in _all_routes(app.routes):
        if not isinstance(route, APIRoute) or not route.path.startswith("/v1"):
            continue
        calls = _dependency_calls(route)
        for method in route.methods:
            seen.add((method, route.path))
            if (method, route.path) in writes:
                assert require_write_key in calls, (method, route.path)
            elif route.path != "/v1/score":  # reads the key inline (hot path, no Depends)
                assert require_read_key in calls or require_write_key in calls, route.path
    assert writes <= seen


# ------------------------------------------------------------------ start-up
def test_api_parts_are_imported_statically_and_their_failures_are_fatal():
    app = app_for()
    paths = {getattr(r, "path", None) for r in _all_routes(app.routes)}
    assert {"/v1/route", "/v1/stream", "/"} <= paths
    settings = RouterSettings()
    settings.route_weights = {"no_such_weight": 1.0}  # bypasses validation on purpose
    with pytest.raises(ValueError, match="no_such_weight"):
        create_app(settings=settings)


async def test_stream_bounds_are_configurable():
    app = app_for(stream_max_clients=1, stream_queue_size=3)
    hub = app.state.stream_hub
    assert (hub.max_clients, hub.queue_size) == (1, 3)
    async with serve_app(app) as c, c.stream("GET", "/v1/stream") as first:
        assert first.status_code == 200
        assert_error(await c.get("/v1/stream"), 503, "too_many_clients")


async def test_unreachable_redis_is_reported_at_start_up(caplog: pytest.LogCaptureFixture):
    caplog.set_level(logging.WARNING, logger="router.http.app")
    url = f"redis://127.0.0.1:{free_port()}/0"
    async with serve_app(app_for(index="redis", redis_url=url)) as c:
        assert_error(await c.get("/readyz"), 503, "index_unavailable")
    lines = [r.getMessage() for r in caplog.records if r.name == "router.http.app"]
    assert any("does not answer at start-up" in m and url in m for m in lines), lines
