"""``kvroute serve`` as a real subprocess: flags, KVROUTE_* env vars, config file, logs."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from _helpers import FakeEngine, batch, free_port, stop_process, stored, wait_until

REPO = Path(__file__).resolve().parents[2]
START_DEADLINE_S = 30.0


class Serve:
    """One ``kvroute serve`` child process on a free port."""

    def __init__(self, args: list[str], env: dict[str, str], tmp: Path) -> None:
        self.port = int(env.get("KVROUTE_PORT", 0)) or free_port()
        if "KVROUTE_PORT" not in env and "--port" not in args:
            args = [*args, "--port", str(self.port)]
        self.stderr_path = tmp / f"serve-{self.port}.log"
        full_env = {**os.environ, **env}
        full_env = {k: v for k, v in full_env.items() if not k.startswith("KVROUTE_")} | env
        with open(self.stderr_path, "wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "router.cli", "serve", *args],
                cwd=REPO,
                env=full_env,
                stdout=err,
                stderr=err,
            )
        self.url = f"http://127.0.0.1:{self.port}"

    def wait_healthy(self) -> None:
        deadline = time.monotonic() + START_DEADLINE_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"kvroute serve exited {self.proc.returncode}: {self.log()}")
            try:
                if httpx.get(self.url + "/healthz", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise AssertionError(f"kvroute serve not healthy in {START_DEADLINE_S}s: {self.log()}")

    def log(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def stop(self) -> int:
        return stop_process(self.proc)


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Any]:
    started: list[Serve] = []

    def start(args: list[str] | None = None, env: dict[str, str] | None = None) -> Serve:
        s = Serve(args or [], env or {}, tmp_path)
        started.append(s)
        s.wait_healthy()
        return s

    yield start
    for s in started:
        s.stop()


async def test_flags_register_workers_and_guard_mutations(serve: Any):
    engine = FakeEngine()
    try:
        spec = f"w0={engine.endpoint},replay={engine.replay_endpoint},http=http://h:1"
        s = serve(["--worker", spec, "--api-key", "k1", "--host", "127.0.0.1"])
        async with httpx.AsyncClient(base_url=s.url, timeout=10) as c:
            [w] = (await c.get("/v1/workers")).json()["workers"]
            assert w["worker_id"] == "w0" and w["endpoint"] == engine.endpoint
            assert w["replay_endpoint"] == engine.replay_endpoint
            assert w["http_endpoint"] == "http://h:1"
            body = {"worker_id": "w1", "endpoint": "tcp://127.0.0.1:9"}
            assert (await c.post("/v1/workers", json=body)).status_code == 401
            r = await c.post("/v1/workers", json=body, headers={"X-API-Key": "k1"})
            assert r.status_code == 201
            # The subprocess router ingests from our engine and scores over HTTP.
            await engine.wait_subscribed()
            await engine.publish(batch(stored([1, 2], list(range(8)))))

            async def hit() -> bool:
                r = await c.post("/v1/score", json={"token_ids": list(range(9))})
                return r.json()["workers"][0]["hit_tokens"] == 8

            await wait_until(hit, what="score over HTTP from the subprocess router")
    finally:
        await engine.close()
    # uvicorn shuts down gracefully on SIGTERM, then re-raises it (exit status -15).
    assert s.stop() in (0, -15)
    assert "router stopped" in s.log()


def test_env_vars_config_file_and_precedence(serve: Any, tmp_path: Path):
    port = free_port()
    cfg = tmp_path / "router.yaml"
    cfg.write_text(
        "max_request_tokens: 5\n"
        "api_key: from-file\n"
        "workers:\n"
        "  - a=tcp://127.0.0.1:9,topic=kv@a\n"
        "  - {worker_id: b, endpoint: 'tcp://127.0.0.1:10'}\n"
    )
    s = serve(
        ["--max-request-tokens", "8"],  # flag beats env beats file
        {
            "KVROUTE_PORT": str(port),
            "KVROUTE_CONFIG": str(cfg),
            "KVROUTE_MAX_REQUEST_TOKENS": "6",
            "KVROUTE_API_KEY_ALL": "true",
        },
    )
    assert s.port == port
    h = {"Authorization": "Bearer from-file"}
    # api_key_all covers every read-only /v1 endpoint, the workers listing included.
    assert httpx.get(s.url + "/v1/workers").status_code == 401
    workers = httpx.get(s.url + "/v1/workers", headers=h).json()["workers"]
    assert [(w["worker_id"], w["topic"]) for w in workers] == [("a", "kv@a"), ("b", "")]
    assert httpx.post(s.url + "/v1/score", json={"token_ids": [1]}).status_code == 401
    r = httpx.post(s.url + "/v1/score", json={"token_ids": list(range(8))}, headers=h)
    assert r.status_code == 200
    r = httpx.post(s.url + "/v1/score", json={"token_ids": list(range(9))}, headers=h)
    assert r.status_code == 413 and "8" in r.json()["error"]["message"]


def test_workers_from_env_and_json_logs(serve: Any):
    s = serve(
        ["--log-json"],
        {"KVROUTE_WORKERS": "x=tcp://127.0.0.1:9;y=tcp://127.0.0.1:10,model=m"},
    )
    workers = httpx.get(s.url + "/v1/workers").json()["workers"]
    assert [(w["worker_id"], w["model"]) for w in workers] == [("x", None), ("y", "m")]
    s.stop()
    lines = [ln for ln in s.log().splitlines() if ln.strip()]
    records = [json.loads(ln) for ln in lines]  # every line is one JSON object
    assert any(r["msg"] == "router stopped" for r in records)
    assert all({"ts", "level", "logger", "msg"} <= set(r) for r in records)


def test_redis_index_from_flags(serve: Any, redis_url: str):
    s = serve(["--index", "redis", "--redis-url", redis_url])
    ready = httpx.get(s.url + "/readyz").json()
    assert ready == {"status": "ready", "index": "redis", "core": ready["core"]}
    assert ready["core"] in ("native", "native-nohash", "python")  # router/native
    assert httpx.get(s.url + "/v1/index/stats").json()["backend"] == "redis"


@pytest.mark.parametrize(
    ("args", "env"),
    [
        (["--worker", "nonsense"], {}),
        (["--index", "memory"], {"KVROUTE_MAX_REQUEST_TOKENS": "lots"}),
        (["--config", "/nonexistent/router.yaml"], {}),
        (["--worker", "w=tcp://*:5557"], {}),  # the engine's bind form: not connectable
        (["--worker", "w=tcp://127.0.0.1:1", "--worker", "w=tcp://127.0.0.1:2"], {}),
    ],
)
def test_invalid_settings_exit_2(args: list[str], env: dict[str, str], tmp_path: Path):
    s = Serve(args, env, tmp_path)
    assert s.proc.wait(timeout=30) == 2
    assert "invalid settings" in s.log() or "duplicate worker id" in s.log()
    assert "Traceback" not in s.log()


def test_sigterm_with_an_open_event_stream_exits_promptly(serve: Any):
    s = serve()
    if httpx.get(s.url + "/openapi.json").json()["paths"].get("/v1/stream") is None:
        pytest.skip("no /v1/stream in this installation")
    with socket.create_connection(("127.0.0.1", s.port), timeout=20) as conn:
        conn.sendall(b"GET /v1/stream HTTP/1.1\r\nHost: x\r\nAccept: text/event-stream\r\n\r\n")
        received = b""
        while b"data:" not in received:
            chunk = conn.recv(4096)
            assert chunk, "stream closed before the first event"
            received += chunk
        t0 = time.monotonic()
        assert s.stop() in (0, -15)  # -9 would mean stop() had to kill it
        assert time.monotonic() - t0 < 10


def test_ctrl_c_stops_the_router_without_a_traceback(serve: Any):
    """uvicorn shuts down on SIGINT, then re-raises KeyboardInterrupt: a traceback and
    exit status -2 for what the operator asked for."""
    s = serve()
    s.proc.send_signal(signal.SIGINT)
    assert s.proc.wait(timeout=20) == 130
    assert "Traceback" not in s.log() and "router stopped" in s.log()
