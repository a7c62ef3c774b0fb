"""Real processes for the proxy tests: ``kvroute engine`` children and a ``kvroute serve``
child in front of them, on free loopback ports. Nothing is faked: the tests talk to the
router's port with the official ``openai`` client, as a user would."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from _helpers import poll as _poll

from router.netutil import free_ports

REPO = Path(__file__).resolve().parents[3]
TOKENIZER = REPO / "router/proxy/data/tiny"
MODEL = "kvroute-sim"
START_TIMEOUT_S = 120.0


def poll(predicate: Callable[[], Any], what: str, timeout: float = 30.0) -> Any:
    """``_helpers.poll`` with the fleet's longer default deadline (real processes)."""
    return _poll(predicate, what, timeout)


def stop(proc: subprocess.Popen[bytes] | None, kill: bool = False) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.kill() if kill else proc.terminate()
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=5)


@dataclass
class EngineProc:
    worker_id: str
    http: int
    pub: int
    replay: int
    log: Path
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http}"

    def spec(self) -> str:
        return (
            f"{self.worker_id}=tcp://127.0.0.1:{self.pub},replay=tcp://127.0.0.1:{self.replay},"
            f"http={self.url}"
        )

    def stats(self) -> dict[str, Any]:
        return httpx.get(f"{self.url}/stats", timeout=10).json()  # type: ignore[no-any-return]


def start_engines(tmp: Path, n: int, *extra: str, prefix: str = "engine") -> list[EngineProc]:
    ports = free_ports(3 * n)
    engines = []
    for i in range(n):
        e = EngineProc(f"{prefix}-{i}", *ports[3 * i : 3 * i + 3], tmp / f"{prefix}-{i}.log")
        cmd = [
            sys.executable, "-m", "router.cli", "engine", "--port", str(e.http),
            "--worker-id", e.worker_id, "--publish", f"tcp://*:{e.pub}",
            "--replay", f"tcp://*:{e.replay}", "--gpu-blocks", "512", "--cpu-blocks", "0",
            "--groups", "full:16", "--tokenizer", str(TOKENIZER), "--log-level", "warning",
            *extra,
        ]  # fmt: skip
        with e.log.open("wb") as log:
            e.proc = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
        engines.append(e)
    return engines


@dataclass
class RouterProc:
    url: str
    log: Path
    proc: subprocess.Popen[bytes]
    engines: list[EngineProc] = field(default_factory=list)

    def workers(self) -> dict[str, dict[str, Any]]:
        r = httpx.get(f"{self.url}/v1/proxy/workers", timeout=10)
        return {w["worker_id"]: w for w in r.json()["workers"]}

    def live(self) -> set[str]:
        return {w for w, info in self.workers().items() if info["live"]}

    def metrics(self) -> str:
        return httpx.get(f"{self.url}/metrics", timeout=10).text

    def dashboard(self) -> dict[str, Any]:
        """The ``proxy`` section of the next dashboard summary (``/v1/stream``)."""
        with httpx.stream("GET", f"{self.url}/v1/stream", timeout=30) as r:
            event = ""
            for line in r.iter_lines():
                if line.startswith("event:"):
                    event = line.partition(":")[2].strip()
                elif line.startswith("data:") and event == "summary":
                    return json.loads(line.partition(":")[2])["proxy"]  # type: ignore[no-any-return]
        raise AssertionError("/v1/stream ended without a summary")


def start_router(
    tmp: Path, specs: Iterable[str], *extra: str, env: dict[str, str] | None = None
) -> RouterProc:
    """``env``: KVROUTE_* settings without a flag, on top of this process's environment."""
    (port,) = free_ports(1)
    cmd = [
        sys.executable, "-m", "router.cli", "serve", "--port", str(port),
        "--tokenizer", str(TOKENIZER), "--health-interval-s", "0.2", "--log-level", "warning",
        *[a for s in specs for a in ("--worker", s)], *extra,
    ]  # fmt: skip
    log = tmp / "router.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}
        )
    return RouterProc(f"http://127.0.0.1:{port}", log, proc)


def wait_caught_up(router: RouterProc, engine: EngineProc, timeout_s: float = 30.0) -> None:
    """Until the router has applied every batch ``engine`` published so far (seqs count
    from 0): what an estimate taken next may rely on."""
    published = engine.stats()["publisher"]["published"]

    def caught_up() -> bool:
        r = httpx.get(f"{router.url}/v1/workers/{engine.worker_id}", timeout=10)
        return bool(r.json().get("last_seq", {}).get("0", -1) >= published - 1)

    poll(caught_up, f"{engine.worker_id}: router caught up with {published}", timeout_s)


def wait_live(router: RouterProc, workers: Iterable[str]) -> None:
    want = set(workers)

    def ready() -> bool:
        for e in router.engines:
            if e.proc is not None and e.proc.poll() is not None:
                raise AssertionError(f"{e.worker_id} exited:\n{e.log.read_text()[-2000:]}")
        if router.proc.poll() is not None:
            raise AssertionError(f"router exited:\n{router.log.read_text()[-2000:]}")
        try:
            return want <= router.live()
        except httpx.HTTPError:
            return False

    poll(ready, f"workers {sorted(want)} live", START_TIMEOUT_S)


def fleet(tmp: Path, n: int, *engine_args: str, router_args: Iterable[str] = ()) -> RouterProc:
    engines = start_engines(tmp, n, *engine_args)
    router = start_router(tmp, [e.spec() for e in engines], *router_args)
    router.engines = engines
    try:
        wait_live(router, [e.worker_id for e in engines])
    except BaseException:
        shutdown(router)
        raise
    return router


def shutdown(router: RouterProc) -> None:
    stop(router.proc)
    for e in router.engines:
        stop(e.proc)


LIGHT = REPO / "benchmarks/light_engines.py"


@dataclass
class LightProc:
    """Light engines in one real process (benchmarks/light_engines.py): own HTTP port and
    own KV event stream each, and a ``POST /fault`` switch per engine."""

    http: list[int]
    pub: list[int]
    replay: list[int]
    log: Path
    proc: subprocess.Popen[bytes] | None = None

    def url(self, i: int) -> str:
        return f"http://127.0.0.1:{self.http[i]}"

    def spec(self, i: int, worker_id: str) -> str:
        return (
            f"{worker_id}=tcp://127.0.0.1:{self.pub[i]},replay=tcp://127.0.0.1:{self.replay[i]},"
            f"http={self.url(i)}"
        )

    def fault(self, i: int, **switch: Any) -> None:
        httpx.post(f"{self.url(i)}/fault", json=switch, timeout=10).raise_for_status()


def start_light(tmp: Path, n: int) -> LightProc:
    ports = free_ports(3 * n)
    light = LightProc(ports[0::3], ports[1::3], ports[2::3], tmp / "light.log")
    triples = [f"{light.http[i]},{light.pub[i]},{light.replay[i]}" for i in range(n)]
    with light.log.open("wb") as out:
        light.proc = subprocess.Popen(
            [sys.executable, str(LIGHT), "--ports", *triples],
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
        )

    def up() -> bool:
        if light.proc is not None and light.proc.poll() is not None:
            raise AssertionError(f"light engines exited:\n{light.log.read_text()[-2000:]}")
        return b"ready" in light.log.read_bytes()

    poll(up, "light engines up", START_TIMEOUT_S)
    return light
