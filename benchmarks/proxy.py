"""Proxy overhead: what putting ``kvroute serve`` between an OpenAI client and the engines
costs, next to vllm-router in the same run when its binary is given.

* added latency -- p50/p99 of a non-streaming completion through the router minus the
  same request sent to the engine directly (rounds interleaved, so load drifts hit both);
* streaming time to first chunk -- direct vs through the router;
* requests/s through one router process with ``--concurrency`` clients, vs the engines
  directly with the same clients (the engines are a simulation, so this is the proxy's
  own ceiling only while the engines are faster than it).

Engines are ``kvroute engine`` processes (tiny tokenizer, token-id prompts so both paths
skip nothing). Run: ``python benchmarks/proxy.py [--workers 4] [--requests 400]
[--vllm-router PATH_TO_vllm-router] [--json OUT]``. Loopback only.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx

from router.netutil import free_ports

REPO = Path(__file__).resolve().parent.parent
TOKENIZER = REPO / "router/proxy/data/tiny"
MODEL = "kvroute-sim"


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def start(cmd: list[str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT)


async def wait_http(url: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    async with httpx.AsyncClient() as c:
        while True:
            try:
                if (await c.get(url, timeout=1)).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{url} not up after {timeout}s")
            await asyncio.sleep(0.2)


def prompt(i: int, size: int = 256) -> list[int]:
    base = 100 + (i % 32) * 97  # 32 distinct prefixes, repeated: cache hits happen
    return [base + (k % 5000) for k in range(size - 8)] + [
        100 + (i * 7 + k) % 8000 for k in range(8)
    ]


async def latency(client: httpx.AsyncClient, urls: dict[str, str], n: int) -> dict[str, Any]:
    """Interleaved sequential requests; per target: p50/p99 ms and streaming TTFC."""
    lat: dict[str, list[float]] = {k: [] for k in urls}
    ttfc: dict[str, list[float]] = {k: [] for k in urls}
    for i in range(n):
        for name, base in urls.items():
            body = {"model": MODEL, "prompt": prompt(i), "max_tokens": 1}
            t0 = time.perf_counter()
            r = await client.post(f"{base}/v1/completions", json=body)
            lat[name].append(time.perf_counter() - t0)
            r.raise_for_status()
            if i % 4 == 0:
                body["stream"] = True
                body["max_tokens"] = 4
                t0 = time.perf_counter()
                async with client.stream("POST", f"{base}/v1/completions", json=body) as s:
                    first = True
                    async for _ in s.aiter_raw():
                        if first:
                            ttfc[name].append(time.perf_counter() - t0)
                            first = False
    out: dict[str, Any] = {}
    for name in urls:
        out[name] = {
            "p50_ms": round(1000 * statistics.median(lat[name]), 3),
            "p99_ms": round(1000 * pct(lat[name], 0.99), 3),
            "ttfc_p50_ms": round(1000 * statistics.median(ttfc[name]), 3),
        }
    return out


async def throughput(base: str, concurrency: int, seconds: float) -> float:
    done = 0
    stop = time.monotonic() + seconds
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(limits=limits, timeout=30) as c:

        async def loop(k: int) -> None:
            nonlocal done
            i = k
            while time.monotonic() < stop:
                body = {"model": MODEL, "prompt": prompt(i), "max_tokens": 1}
                (await c.post(f"{base}/v1/completions", json=body)).raise_for_status()
                done += 1
                i += concurrency

        t0 = time.monotonic()
        await asyncio.gather(*(loop(k) for k in range(concurrency)))
        return done / (time.monotonic() - t0)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="kvroute-bench-proxy-"))
    ports = free_ports(3 * args.workers + 2)
    procs: list[subprocess.Popen[bytes]] = []
    specs, engines = [], []
    try:
        for i in range(args.workers):
            http, pub, rep = ports[3 * i : 3 * i + 3]
            procs.append(start([
                sys.executable, "-m", "router.cli", "engine", "--port", str(http),
                "--worker-id", f"e{i}", "--publish", f"tcp://*:{pub}",
                "--replay", f"tcp://*:{rep}", "--gpu-blocks", "4096", "--cpu-blocks", "0",
                "--tokenizer", str(TOKENIZER), "--log-level", "warning",
            ], tmp / f"e{i}.log"))  # fmt: skip
            engines.append(f"http://127.0.0.1:{http}")
            specs.append(
                f"e{i}=tcp://127.0.0.1:{pub},replay=tcp://127.0.0.1:{rep},http={engines[-1]}"
            )
        kv_port, vr_port = ports[-2:]
        procs.append(start([
            sys.executable, "-m", "router.cli", "serve", "--port", str(kv_port),
            "--tokenizer", str(TOKENIZER), "--log-level", "warning",
            *[a for s in specs for a in ("--worker", s)],
        ], tmp / "router.log"))  # fmt: skip
        urls = {"direct": engines[0], "kvroute": f"http://127.0.0.1:{kv_port}"}
        if args.vllm_router:
            procs.append(start([
                args.vllm_router, "--host", "127.0.0.1", "--port", str(vr_port),
                "--worker-urls", *engines, "--policy", "round_robin",
            ], tmp / "vllm-router.log"))  # fmt: skip
            urls["vllm-router"] = f"http://127.0.0.1:{vr_port}"
        for e in engines:
            await wait_http(f"{e}/health")
        await wait_http(f"{urls['kvroute']}/v1/models")
        async with httpx.AsyncClient(timeout=10) as c:  # until the proxy routes
            deadline = time.monotonic() + 60
            while True:
                workers = (await c.get(f"{urls['kvroute']}/v1/proxy/workers")).json()["workers"]
                if all(w["live"] for w in workers):
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"workers not live: {workers}")
                await asyncio.sleep(0.2)
        if "vllm-router" in urls:
            await wait_http(f"{urls['vllm-router']}/health")
        limits = httpx.Limits(max_keepalive_connections=8)
        async with httpx.AsyncClient(timeout=30, limits=limits) as client:
            await latency(client, urls, 20)  # warm-up: connections, caches
            lat = await latency(client, urls, args.requests)
        base = lat["direct"]
        for row in lat.values():
            row["added_p50_ms"] = round(row["p50_ms"] - base["p50_ms"], 3)
            row["added_p99_ms"] = round(row["p99_ms"] - base["p99_ms"], 3)
        rps = {}
        for name, url in urls.items():
            target = url if name != "direct" else engines[0]
            rps[name] = round(await throughput(target, args.concurrency, args.seconds), 1)
        return {"workers": args.workers, "latency": lat, "req_per_s": rps}
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--requests", type=int, default=400)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--vllm-router", default=None, help="path to a vllm-router binary")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    result = asyncio.run(run(args))
    print(json.dumps(result, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
