"""Bad input found by an adversarial pass over every endpoint: each is a 4xx JSON answer,
counted in ``kvroute_http_errors_total``, and never a 500, a traceback per request, or
state left behind."""

from __future__ import annotations

import logging
from typing import Any

import httpx
import pytest
from _helpers import FakeEngine, serve_app
from fastapi import FastAPI

from router.config import RouterSettings
from router.http import create_app
from router.proxy import outermost

DEEP = b'{"model": "m", "prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"


def app_for(**settings: Any) -> FastAPI:
    return create_app(settings=RouterSettings(replay_timeout_s=1.0, **settings))


def error_code(r: httpx.Response, status: int) -> str:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json"), r.headers
    return str(r.json()["error"]["code"])


def counted(metrics: str, code: str) -> float:
    for line in metrics.splitlines():
        if line.startswith(f'kvroute_http_errors_total{{code="{code}"}}'):
            return float(line.split()[-1])
    return 0.0


async def test_invalid_utf8_in_a_json_string_is_422_not_500() -> None:
    async with serve_app(app_for()) as c:
        body = b'{"token_ids": [1], "lora_name": "\xff\xfe"}'
        headers = {"content-type": "application/json"}
        for _ in range(2):  # the connection stays usable after the answer
            r = await c.post("/v1/score", content=body, headers=headers)
            assert error_code(r, 422) == "invalid_request"
            assert "UTF-8" in r.json()["error"]["message"]
        assert counted((await c.get("/metrics")).text, "invalid_request") == 2


async def test_proxy_bodies_that_are_not_utf8_or_nest_too_deep_are_400() -> None:
    async with serve_app(app_for()) as c:
        for path in ("/v1/completions", "/v1/chat/completions"):
            r = await c.post(path, content=b'{"model": "m", "prompt": "\xff\xfe"}')
            assert error_code(r, 400) == "invalid_json"
            r = await c.post(path, content=DEEP)
            assert error_code(r, 400) == "invalid_json"
        metrics = (await c.get("/metrics")).text
        assert 'kvroute_proxy_requests_total{endpoint="chat",outcome="invalid_json"} 2.0' in metrics


async def test_tokenize_pass_through_with_deeply_nested_json_is_400() -> None:
    async with serve_app(app_for()) as c:
        for path in ("/tokenize", "/detokenize"):
            r = await c.post(path, content=DEEP)
            assert error_code(r, 400) == "invalid_json"
        assert counted((await c.get("/metrics")).text, "invalid_json") == 2


async def test_route_with_an_empty_worker_list_is_a_client_error() -> None:
    async with serve_app(app_for()) as c:
        r = await c.post("/v1/route", json={"token_ids": [1, 2, 3], "workers": []})
        assert error_code(r, 422) == "invalid_request"


async def test_a_request_id_with_a_slash_can_be_finished() -> None:
    """/v1/route accepts free-form ids; finish took the id as one path segment, so such a
    request stayed counted as load until its TTL."""
    engine = FakeEngine()
    try:
        async with serve_app(app_for()) as c:
            assert (await c.post("/v1/workers", json=engine.spec("w0"))).status_code == 201
            for rid in ("slash/id1", "a/finish", "tenant/7/req/9"):
                body = {"token_ids": [1, 2, 3], "request_id": rid}
                assert (await c.post("/v1/route", json=body)).status_code == 200
                quoted = rid.replace("/", "%2F")
                r = await c.post(f"/v1/requests/{quoted}/finish")
                assert r.status_code == 204, r.text
                r = await c.post(f"/v1/requests/{rid}/finish")  # unquoted: the same id
                assert error_code(r, 404) == "unknown_request"
            assert 'kvroute_route_inflight{worker="w0"}' not in (await c.get("/metrics")).text
    finally:
        await engine.close()


async def _raise() -> Any:
    raise RuntimeError("boom")


async def test_an_unexpected_error_is_a_json_500_logged_rate_limited(
    caplog: pytest.LogCaptureFixture,
) -> None:
    app = app_for()
    app.add_api_route("/v1/boom", _raise, methods=["GET"])  # a bug, in a real app
    caplog.set_level(logging.ERROR)
    # raise_app_exceptions: an exception that escapes the app (Starlette's catch-all
    # re-raises after answering, so uvicorn logged every one again) fails the test.
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=True)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
        for _ in range(8):
            r = await c.get("/v1/boom")
            assert error_code(r, 500) == "internal_error"
            assert r.json()["error"]["message"] == "internal error: RuntimeError"
        metrics = (await c.get("/metrics")).text
    assert counted(metrics, "internal_error") == 8
    logged = [r for r in caplog.records if "unhandled error" in r.getMessage()]
    assert 1 <= len(logged) <= 5  # the burst, then one a minute
    assert logged[0].exc_info is not None  # with its traceback


async def test_a_client_leaving_mid_body_is_counted_without_a_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    app = app_for()
    caplog.set_level(logging.ERROR)
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    for path in ("/v1/score", "/tokenize", "/v1/completions"):
        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": "POST",
            "scheme": "http",
            "path": path,
            "raw_path": path.encode(),
            "query_string": b"",
            "root_path": "",
            "headers": [(b"content-type", b"application/json"), (b"content-length", b"100")],
            "client": ("127.0.0.1", 5000),
            "server": ("127.0.0.1", 8000),
        }
        await outermost(app)(scope, receive, send)  # raised ClientDisconnect/CancelledError
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert app.state.http_errors.counts["client_disconnected"] == 2  # score, tokenize
    assert app.state.proxy.counters.requests["completions", "client_cancelled"] == 1


async def test_the_rate_limit_covers_the_proxied_completions_and_charges_once() -> None:
    app = app_for(client_rate_limit=0.001, client_rate_burst=3)
    for front in (app, outermost(app)):  # in the app, and as `kvroute serve` runs it
        app.state.rate_limiter._buckets.clear()
        transport = httpx.ASGITransport(app=front)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
            # Three plain requests pass: one token each, not one per layer.
            for _ in range(3):
                assert (await c.get("/v1/workers")).status_code == 200
            r = await c.post("/v1/completions", json={"model": "m", "prompt": "hi"})
            assert error_code(r, 429) == "rate_limited"
            r = await c.post("/v1/chat/completions", json={"model": "m", "messages": []})
            assert error_code(r, 429) == "rate_limited"
