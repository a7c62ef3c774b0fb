"""The REST contract (docs/design.md#rest-contract) over real HTTP: shapes, errors, auth,
metrics, outages."""

from __future__ import annotations

import subprocess
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from _helpers import FakeEngine, batch, serve_app, stored, wait_seq, wait_until

from router import native
from router.config import RouterSettings
from router.http import create_app
from router.service import RouterService

KEY = "s3cret"


def app_for(**settings: Any) -> Any:
    return create_app(settings=RouterSettings(replay_timeout_s=1.0, **settings))


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with serve_app(app_for(max_request_tokens=64)) as c:
        yield c


@pytest.fixture
async def engine() -> AsyncIterator[FakeEngine]:
    eng = FakeEngine()
    yield eng
    await eng.close()


def assert_error(r: httpx.Response, status: int, code: str | None = None) -> dict[str, Any]:
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error"}, body
    assert set(body["error"]) == {"code", "message", "type", "param"}, body  # vLLM's shape
    assert isinstance(body["error"]["type"], str) and body["error"]["type"], body
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    if code is not None:
        assert body["error"]["code"] == code, body
    return body["error"]  # type: ignore[no-any-return]


async def test_health_ready_docs(client: httpx.AsyncClient):
    assert (await client.get("/healthz")).json() == {"status": "ok"}
    r = await client.get("/readyz")
    assert r.status_code == 200 and r.json()["index"] == "memory"
    assert r.json()["core"] == native.ACTIVE  # which scoring core runs (router/native)
    assert (await client.get("/docs")).status_code == 200
    paths = (await client.get("/openapi.json")).json()["paths"]
    for p in ("/v1/workers", "/v1/workers/{worker_id}", "/v1/score", "/v1/index/stats"):
        assert p in paths
    # The shared error entries (router.http.errors) keep one wording per rule.
    score_401 = paths["/v1/score"]["post"]["responses"]["401"]["description"]
    route_401 = paths["/v1/route"]["post"]["responses"]["401"]["description"]
    finish_401 = paths["/v1/requests/{request_id}/finish"]["post"]["responses"]["401"]
    assert "api_key_all" in score_401 and route_401 == finish_401["description"] != score_401


async def test_worker_crud_and_errors(client: httpx.AsyncClient, engine: FakeEngine):
    r = await client.post("/v1/workers", json=engine.spec("w0", model="m"))
    assert r.status_code == 201, r.text
    assert r.json()["worker_id"] == "w0" and r.json()["model"] == "m"
    assert r.json()["state"] in ("connecting", "connected", "resyncing")
    assert_error(await client.post("/v1/workers", json=engine.spec("w0")), 409, "worker_exists")
    await engine.wait_subscribed()
    await engine.publish(batch(stored([1, 2], list(range(8)))))
    info = await wait_seq(client, "w0", 0)
    assert info["state"] == "connected"
    assert info["events"] == 1 and info["gaps"] == 0
    assert info["groups"]["0"]["kind"] == "full_attention"
    assert info["groups"]["0"]["block_size"] == 4
    assert info["groups"]["0"]["blocks_by_medium"] == {"GPU": 2}
    listing = (await client.get("/v1/workers")).json()["workers"]
    assert [w["worker_id"] for w in listing] == ["w0"]

    score = (await client.post("/v1/score", json={"token_ids": list(range(9))})).json()
    assert score["workers"][0]["hit_tokens"] == 8

    assert (await client.delete("/v1/workers/w0")).status_code == 204
    assert_error(await client.get("/v1/workers/w0"), 404, "unknown_worker")
    assert_error(await client.delete("/v1/workers/w0"), 404, "unknown_worker")
    stats = (await client.get("/v1/index/stats")).json()
    assert stats["entries"] == 0 and stats["registered_workers"] == 0
    # Registering it again starts from an empty index entry set.
    r = await client.post("/v1/workers", json=engine.spec("w0"))
    assert r.status_code == 201 and r.json()["groups"] == {}


@pytest.mark.parametrize(
    "body",
    [
        {"endpoint": "tcp://127.0.0.1:1"},  # no worker_id
        {"worker_id": "bad id!", "endpoint": "tcp://127.0.0.1:1"},
        {"worker_id": "w", "endpoint": ""},
        {"worker_id": "w", "endpoint": "tcp://127.0.0.1:1", "surprise": 1},
        {"worker_id": "w", "endpoint": 5},
        {"worker_id": "w", "endpoint": "tcp://*:5557"},  # the engine's bind form
        {"worker_id": "w", "endpoint": "nonsense"},
        {"worker_id": "w", "endpoint": "tcp://127.0.0.1:1", "replay_endpoint": "bogus"},
    ],
)
async def test_invalid_worker_bodies_are_422(client: httpx.AsyncClient, body: dict[str, Any]):
    assert_error(await client.post("/v1/workers", json=body), 422)
    assert (await client.get("/v1/workers")).json()["workers"] == []


async def test_score_errors(client: httpx.AsyncClient, engine: FakeEngine):
    await client.post("/v1/workers", json=engine.spec("w0"))
    err = assert_error(
        await client.post("/v1/score", json={"token_ids": list(range(65))}),
        413,
        "payload_too_large",
    )
    assert "64" in err["message"]
    for bad in (
        {"token_ids": "abc"},
        {"token_ids": [1, "2"]},
        {"token_ids": [1.5]},
        {"token_ids": [True]},
        {},
        {"token_ids": [1], "workers": "w0"},
        {"token_ids": [1], "unknown": 1},
    ):
        assert_error(await client.post("/v1/score", json=bad), 422, "invalid_request")
    r = await client.post(
        "/v1/score", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert_error(r, 422)
    err = assert_error(
        await client.post("/v1/score", json={"token_ids": [1, 2], "workers": ["w0", "ghost"]}),
        404,
        "unknown_worker",
    )
    assert "ghost" in err["message"]
    ok = await client.post("/v1/score", json={"token_ids": [1, 2], "workers": ["w0"]})
    assert ok.status_code == 200
    assert ok.json()["workers"][0] == {
        "worker_id": "w0",
        "hit_tokens": 0,
        "hit_tokens_gpu": 0,
        "score": 0.0,
        "learned": False,
        "groups": [],
        "lower_bound": False,
    }


async def test_transport_level_errors_are_json(client: httpx.AsyncClient):
    assert_error(await client.get("/no/such/path"), 404, "not_found")
    assert_error(await client.put("/v1/score", json={}), 405, "method_not_allowed")
    big = b'{"token_ids": [' + b"1," * 600_000 + b"1]}"
    r = await client.post("/v1/score", content=big, headers={"content-type": "application/json"})
    assert_error(r, 413, "payload_too_large")


async def test_unexpected_errors_are_json_500():
    app = app_for()

    @app.get("/boom")
    async def boom() -> None:
        raise RuntimeError("kaboom")

    async with serve_app(app) as c:
        err = assert_error(await c.get("/boom"), 500, "internal_error")
        assert "kaboom" not in err["message"]  # no internals leak
        assert (await c.get("/healthz")).status_code == 200


async def test_api_key_on_mutating_endpoints(engine: FakeEngine):
    async with serve_app(app_for(api_key=KEY)) as c:
        body = engine.spec("w0")
        assert_error(await c.post("/v1/workers", json=body), 401, "unauthorized")
        r = await c.post("/v1/workers", json=body, headers={"Authorization": "Bearer wrong"})
        assert_error(r, 401)
        r = await c.post("/v1/workers", json=body, headers={"Authorization": f"Bearer {KEY}"})
        assert r.status_code == 201
        assert_error(await c.delete("/v1/workers/w0"), 401)
        # Reads stay open without api_key_all.
        assert (await c.get("/v1/workers")).status_code == 200
        assert (await c.post("/v1/score", json={"token_ids": [1]})).status_code == 200
        r = await c.delete("/v1/workers/w0", headers={"X-API-Key": KEY})
        assert r.status_code == 204


async def test_api_key_all_protects_score():
    async with serve_app(app_for(api_key=KEY, api_key_all=True)) as c:
        assert_error(await c.post("/v1/score", json={"token_ids": [1]}), 401)
        r = await c.post("/v1/score", json={"token_ids": [1]}, headers={"X-API-Key": KEY})
        assert r.status_code == 200
        assert (await c.get("/healthz")).status_code == 200


async def test_metrics_expose_transport_and_index_counters(
    client: httpx.AsyncClient, engine: FakeEngine
):
    await client.post("/v1/workers", json=engine.spec("w0"))
    await engine.wait_subscribed()
    await engine.publish(batch(stored([1, 2], list(range(8)))))
    await engine.send_raw([b"garbage"])
    await wait_seq(client, "w0", 0)
    await client.post("/v1/score", json={"token_ids": list(range(9))})
    text = (await client.get("/metrics")).text
    for line in (
        'kvroute_batches_total{worker="w0"} 1.0',
        'kvroute_events_total{worker="w0"} 1.0',
        'kvroute_decode_errors_total{worker="w0"} 1.0',
        'kvroute_worker_state{state="connected",worker="w0"} 1.0',
        'kvroute_last_seq{rank="0",worker="w0"} 0.0',
        'kvroute_worker_blocks{group="0",medium="GPU",worker="w0"} 2.0',
        "kvroute_index_entries 2.0",
        "kvroute_ingest_blocks_stored_total 2.0",
        "kvroute_score_duration_seconds_count 1.0",
        "kvroute_index_up 1.0",
    ):
        assert line in text, line
    for name in ("gaps", "replays", "resyncs", "unknown_events", "ingest_retries"):
        assert f'kvroute_{name}_total{{worker="w0"}}' in text


async def test_two_apps_in_one_process_have_separate_registries():
    async with serve_app(app_for()) as a, serve_app(app_for()) as b:
        assert (await a.get("/metrics")).status_code == 200
        assert (await b.get("/metrics")).status_code == 200


# ---------------------------------------------------------------------------- redis outage


class PersistentRedis:
    """A redis-server that can be shut down (saving its data) and restarted on its port."""

    def __init__(self, port: int, workdir: Path) -> None:
        self.port = port
        self.dir = workdir
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [
                *("redis-server", "--port", str(self.port), "--bind", "127.0.0.1"),
                *("--save", "", "--appendonly", "no", "--dir", str(self.dir)),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def cli(self, *args: str) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(
            ["redis-cli", "-p", str(self.port), *args], capture_output=True, timeout=10
        )

    def shutdown(self) -> None:
        self.cli("shutdown", "save")
        if self.proc is not None:
            self.proc.wait(timeout=10)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)


@pytest.fixture
def persistent_redis(tmp_path: Path, redis_factory: Callable[[], Any]) -> Any:
    # Borrow a free port from a factory server (the fixture checks redis-server exists).
    probe = redis_factory()
    port = probe.port
    probe.stop()
    server = PersistentRedis(port, tmp_path)
    server.start()
    yield server
    server.kill()


async def test_redis_outage_503_retry_and_resume(persistent_redis: PersistentRedis):
    server = persistent_redis
    await wait_until(lambda: server.cli("ping").stdout.strip() == b"PONG", what="redis up")
    engine = FakeEngine()
    settings = RouterSettings(
        index="redis",
        redis_url=server.url,
        ingest_retry_initial_s=0.05,
        ingest_retry_max_s=0.2,
        replay_timeout_s=1.0,
    )
    svc = RouterService(settings)
    try:
        async with serve_app(create_app(svc)) as c:
            assert (await c.post("/v1/workers", json=engine.spec("w0"))).status_code == 201
            await engine.wait_subscribed()
            await engine.publish(batch(stored([1, 2], list(range(8)))))
            await wait_seq(c, "w0", 0)
            assert (await c.get("/readyz")).status_code == 200

            server.shutdown()
            assert_error(await c.get("/readyz"), 503, "index_unavailable")
            err = assert_error(
                await c.post("/v1/score", json={"token_ids": list(range(9))}),
                503,
                "index_unavailable",
            )
            assert "redis" in err["message"]
            # Ingestion keeps the batch and retries; lag is visible.
            await engine.publish(batch(stored([3], [8, 9, 10, 11], parent=2)))
            info = await wait_until(
                lambda: _lagging(c), what="ingest retries reported in /v1/workers"
            )
            assert info["last_seq"] == {"0": 0}
            metrics = (await c.get("/metrics")).text
            assert "kvroute_index_up 0.0" in metrics
            assert 'kvroute_ingest_retries_total{worker="w0"}' in metrics

            server.start()
            await wait_seq(c, "w0", 1)
            assert (await c.get("/readyz")).status_code == 200
            r = await c.post("/v1/score", json={"token_ids": list(range(13))})
            assert r.status_code == 200 and r.json()["workers"][0]["hit_tokens"] == 12
            info = (await c.get("/v1/workers/w0")).json()
            assert info["ingest_lag_s"] == 0.0
    finally:
        await engine.close()


async def _lagging(c: httpx.AsyncClient) -> dict[str, Any] | None:
    info = (await c.get("/v1/workers/w0")).json()
    return info if info["ingest_retries"] >= 2 and info["ingest_lag_s"] > 0 else None
