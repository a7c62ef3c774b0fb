"""The demo's fleet: ``kvroute engine`` processes on loopback and the router in-process.

Separate from the workload replay and its measurements (``router.ops.demo``): this is
process and socket plumbing -- free ports, start-up checks, clean shutdown, and waiting
until the router has applied an engine's latest batch.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from router.netutil import free_ports, listen_socket

TOKENIZER = Path(__file__).resolve().parents[1] / "proxy" / "data" / "tiny"
MODEL = "kvroute-sim"
SYNC_TIMEOUT_S = 10.0


@dataclass
class Engine:
    worker_id: str
    port: int
    pub_port: int
    replay_port: int
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def spec(self) -> str:
        return (
            f"{self.worker_id}=tcp://127.0.0.1:{self.pub_port},"
            f"replay=tcp://127.0.0.1:{self.replay_port},http={self.url}"
        )


# ---------------------------------------------------------------------- engines
def start_engines(args: argparse.Namespace, logdir: Path) -> list[Engine]:
    ports = free_ports(3 * args.workers)
    engines = []
    for i in range(args.workers):
        port, pub_port, replay_port = ports[3 * i : 3 * i + 3]
        e = Engine(f"engine-{i}", port, pub_port, replay_port, logdir / f"engine-{i}.log")
        cmd = [
            sys.executable, "-m", "router.cli", "engine",
            "--host", "127.0.0.1", "--port", str(e.port), "--worker-id", e.worker_id,
            # Loopback only: the engine binds its PUB (--publish-mode bind, the default).
            "--publish", f"tcp://127.0.0.1:{e.pub_port}",
            "--replay", f"tcp://127.0.0.1:{e.replay_port}",
            "--gpu-blocks", str(args.gpu_blocks), "--cpu-blocks", str(args.cpu_blocks),
            "--groups", args.groups, "--log-level", "warning",
            "--tokenizer", str(TOKENIZER), "--served-model-name", MODEL,
        ]  # fmt: skip
        with e.log_path.open("wb") as log:
            e.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        engines.append(e)
    return engines


def stop_engines(engines: Sequence[Engine]) -> None:
    for e in engines:
        if e.proc is not None and e.proc.poll() is None:
            e.proc.terminate()
    for e in engines:
        if e.proc is None:
            continue
        try:
            e.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            e.proc.kill()
            e.proc.wait(timeout=10)


async def wait_healthy(
    client: httpx.AsyncClient, engines: Sequence[Engine], timeout: float
) -> None:
    deadline = time.monotonic() + timeout
    pending = list(engines)
    while pending:
        for e in list(pending):
            if e.proc is not None and e.proc.poll() is not None:
                tail = e.log_path.read_text(errors="replace")[-2000:]
                raise RuntimeError(f"{e.worker_id} exited ({e.proc.returncode}):\n{tail}")
            with contextlib.suppress(httpx.HTTPError):
                if (await client.get(f"{e.url}/health", timeout=1)).status_code == 200:
                    pending.remove(e)
        if pending and time.monotonic() > deadline:
            raise RuntimeError(
                f"engines not healthy after {timeout}s: {[e.worker_id for e in pending]}"
            )
        await asyncio.sleep(0.1)


# ----------------------------------------------------------------------- router
@contextlib.asynccontextmanager
async def start_router(engines: Sequence[Engine]) -> Any:
    """The router in this process and event loop: (service, base URL)."""
    import uvicorn

    from router.config import RouterSettings, parse_worker_spec
    from router.http.app import create_app
    from router.service import RouterService

    settings = RouterSettings(
        workers=[parse_worker_spec(e.spec()) for e in engines],
        tokenizers={"*": str(TOKENIZER)},
        health_interval_s=0.25,
    )
    service = RouterService(settings)
    app = create_app(service)
    sock = listen_socket()
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        while not server.started:
            if task.done():
                task.result()
                raise RuntimeError("the router did not start")
            await asyncio.sleep(0.02)
        deadline = time.monotonic() + 60
        while any(service.proxy.health.why_not_live(e.worker_id) for e in engines):
            if time.monotonic() > deadline:
                why = {e.worker_id: service.proxy.health.why_not_live(e.worker_id) for e in engines}
                raise RuntimeError(f"workers not live in the proxy: {why}")
            await asyncio.sleep(0.05)
        yield service, f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        with contextlib.suppress(Exception):
            await asyncio.wait_for(task, 15)
        sock.close()


async def wait_synced(service: Any, worker_id: str, batches: int) -> bool:
    """Wait until the router applied the engine's ``batches``-th batch (seq batches-1)."""
    deadline = time.monotonic() + SYNC_TIMEOUT_S
    while True:
        sub = service.subscriptions.get(worker_id)
        if batches == 0 or max(sub.last_seq.values(), default=-1) >= batches - 1:
            return True
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.0005)
