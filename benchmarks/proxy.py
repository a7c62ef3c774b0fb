"""Proxy overhead: what putting ``kvroute serve`` between an OpenAI client and the engines
costs, next to vllm-router in the same run when its binary is given.

* added latency -- p50/p99 of a non-streaming completion through the router minus the
  same request sent to the engine directly (rounds interleaved, so load drifts hit both);
* streaming time to first chunk -- direct vs through the router;
* requests/s through one router process with ``--concurrency`` clients, vs the engines
  directly with the same clients (the engines are a simulation, so this is the proxy's
  own ceiling only while the engines are faster than it).

Engines are ``kvroute engine`` processes (tiny tokenizer, token-id prompts so both paths
skip nothing), or with ``--light N`` N light engines in one process
(benchmarks/light_engines.py: own HTTP port and own KV event stream each, answers in
microseconds) for fleet sizes one machine cannot hold as real processes. Run:
``python benchmarks/proxy.py [--workers 4 | --light 64] [--requests 400] [--runs 3]
[--vllm-router PATH] [--json OUT]`` (``make bench-proxy``). Loopback only.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx

from benchmarks.stats import pct
from router.netutil import free_ports

REPO = Path(__file__).resolve().parent.parent
TOKENIZER = REPO / "router/proxy/data/tiny"
MODEL = "kvroute-sim"


def start(cmd: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """``cmd`` from the repository root, output to ``log``, ``env`` over this environment."""
    with log.open("wb") as out:
        return subprocess.Popen(
            cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}
        )


def report(result: dict[str, Any], table: str, json_path: str | None) -> None:
    """Print the raw result and its table; keep the raw result at ``json_path``."""
    text = json.dumps(result, indent=2)
    print(text)
    print(table)
    if json_path:
        Path(json_path).write_text(text + "\n")


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
    """Interleaved sequential requests; per target: p50/p99 ms and streaming TTFC, and
    where its slowest 1 % came from (``tail``, see ``tail_of``)."""
    lat: dict[str, list[float]] = {k: [] for k in urls}
    ttfc: dict[str, list[float]] = {k: [] for k in urls}
    served: list[str] = []  # kvroute's x-kvroute-worker per round
    for i in range(n):
        for name, base in urls.items():
            body = {"model": MODEL, "prompt": prompt(i), "max_tokens": 1}
            t0 = time.perf_counter()
            r = await client.post(f"{base}/v1/completions", json=body)
            lat[name].append(time.perf_counter() - t0)
            r.raise_for_status()
            if name == "kvroute":
                served.append(r.headers.get("x-kvroute-worker", "?"))
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
        if name != "direct":
            out[name]["tail"] = tail_of(
                lat[name], lat["direct"], served if name == "kvroute" else []
            )
    return out


def tail_of(mine: list[float], direct: list[float], served: list[str]) -> dict[str, Any]:
    """Where a target's slowest 1 % of rounds came from: in how many of them the direct
    request of the same round (sent just before) was slow too (above the direct p90: the
    machine or the engines stalled, not the router), how much slower than the direct one
    they were, and which workers served them (kvroute)."""
    k = max(1, len(mine) // 100)
    worst = sorted(range(len(mine)), key=mine.__getitem__)[-k:]
    slow_direct = pct(direct, 0.90)
    workers: dict[str, int] = {}
    for i in worst:
        if served:
            workers[served[i]] = workers.get(served[i], 0) + 1
    return {
        "rounds": len(worst),
        "direct_also_slow": sum(direct[i] > slow_direct for i in worst),
        "ms": [round(1000 * mine[i], 2) for i in worst],
        "minus_direct_ms": [round(1000 * (mine[i] - direct[i]), 2) for i in worst],
        **({"workers": workers} if served else {}),
    }


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


def vllm_router_binary(given: str | None) -> str | None:
    """``--vllm-router`` or the one ``make bench-proxy-peers`` installs."""
    if given:
        return given
    default = REPO / ".venv-peers/vllm-router/bin/vllm-router"
    return str(default) if default.exists() else None


def start_fleet(
    args: argparse.Namespace, tmp: Path, procs: list[subprocess.Popen[bytes]]
) -> tuple[list[str], list[str]]:
    """Engines (``kvroute engine`` each, or ``--light N`` light engines in one process):
    their base URLs and ``--worker`` specs."""
    n = args.light or args.workers
    ports = free_ports(3 * n)
    engines = [f"http://127.0.0.1:{ports[3 * i]}" for i in range(n)]
    prefix = "l" if args.light else "e"
    specs = [
        f"{prefix}{i}=tcp://127.0.0.1:{ports[3 * i + 1]},replay=tcp://127.0.0.1:{ports[3 * i + 2]},"
        f"http={engines[i]},model={MODEL}"
        for i in range(n)
    ]
    if args.light:
        triples = [",".join(map(str, ports[3 * i : 3 * i + 3])) for i in range(n)]
        procs.append(start([
            sys.executable, str(REPO / "benchmarks/light_engines.py"), "--ports", *triples,
        ], tmp / "light.log"))  # fmt: skip
        return engines, specs
    for i in range(n):
        http, pub, rep = ports[3 * i : 3 * i + 3]
        procs.append(start([
            sys.executable, "-m", "router.cli", "engine", "--port", str(http),
            "--worker-id", f"e{i}", "--publish", f"tcp://127.0.0.1:{pub}",
            "--replay", f"tcp://127.0.0.1:{rep}", "--gpu-blocks", "4096", "--cpu-blocks", "0",
            "--tokenizer", str(TOKENIZER), "--log-level", "warning",
        ], tmp / f"e{i}.log"))  # fmt: skip
    return engines, specs


async def wait_live(url: str, timeout: float = 120) -> None:
    async with httpx.AsyncClient(timeout=10) as c:  # until the proxy routes to every worker
        deadline = time.monotonic() + timeout
        while True:
            workers = (await c.get(f"{url}/v1/proxy/workers")).json()["workers"]
            if all(w["live"] for w in workers):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"not live: {[w['worker_id'] for w in workers if not w['live']][:5]}"
                )
            await asyncio.sleep(0.2)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="kvroute-bench-proxy-"))
    procs: list[subprocess.Popen[bytes]] = []
    try:
        engines, specs = start_fleet(args, tmp, procs)
        kv_port, vr_port, vr_metrics = free_ports(3)
        procs.append(start([
            sys.executable, "-m", "router.cli", "serve", "--port", str(kv_port),
            "--tokenizer", str(TOKENIZER), "--log-level", "warning",
            *[a for s in specs for a in ("--worker", s)], *args.router_arg,
        ], tmp / "router.log"))  # fmt: skip
        urls = {"direct": engines[0], "kvroute": f"http://127.0.0.1:{kv_port}"}
        binary = vllm_router_binary(args.vllm_router)
        if binary:
            procs.append(start([
                binary, "--host", "127.0.0.1", "--port", str(vr_port),
                "--worker-urls", *engines, "--policy", args.vllm_router_policy,
                "--prometheus-host", "127.0.0.1", "--prometheus-port", str(vr_metrics),
            ], tmp / "vllm-router.log"))  # fmt: skip
            urls["vllm-router"] = f"http://127.0.0.1:{vr_port}"
        for e in engines:
            await wait_http(f"{e}/health")
        await wait_http(f"{urls['kvroute']}/v1/models")
        await wait_live(urls["kvroute"])
        if "vllm-router" in urls:
            await wait_http(f"{urls['vllm-router']}/health")
        limits = httpx.Limits(max_keepalive_connections=8)
        runs = []
        async with httpx.AsyncClient(timeout=30, limits=limits) as client:
            await latency(client, urls, 20)  # warm-up: connections, caches
            for _ in range(args.runs):
                load = os.getloadavg()[0]
                lat = await latency(client, urls, args.requests)
                lat["load_avg_1m"] = {"start": round(load, 2), "end": round(os.getloadavg()[0], 2)}
                base = lat["direct"]
                for name in urls:
                    row = lat[name]
                    row["added_p50_ms"] = round(row["p50_ms"] - base["p50_ms"], 3)
                    row["added_p99_ms"] = round(row["p99_ms"] - base["p99_ms"], 3)
                runs.append(lat)
        rps = {}
        for name, url in urls.items():
            rps[name] = round(await throughput(url, args.concurrency, args.seconds), 1)
        fleet = f"{len(engines)} light engines" if args.light else f"{len(engines)} engines"
        extra = {"router_args": args.router_arg} if args.router_arg else {}
        return {"fleet": fleet, "workers": len(engines), "runs": runs, "req_per_s": rps, **extra}
    finally:
        print(f"logs: {tmp}", file=sys.stderr)
        stop_all(procs)


def stop_all(procs: Sequence[subprocess.Popen[Any]]) -> None:
    """Terminate every process, then wait for each (10 s), killing the ones that stay."""
    for p in procs:
        p.terminate()
    for p in procs:
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()


def summary(result: dict[str, Any]) -> str:
    """Ranges over the runs, as docs/proxy.md prints them."""
    lines = [f"{result['fleet']}: min-max over {len(result['runs'])} runs"]
    for name in result["req_per_s"]:

        def rng(key: str, name: str = name) -> str:
            vals = [r[name][key] for r in result["runs"]]
            return f"{min(vals):.2f}-{max(vals):.2f}"

        lines.append(
            f"  {name:12s} p50 {rng('p50_ms')}  p99 {rng('p99_ms')}  added p50 "
            f"{rng('added_p50_ms')}  added p99 {rng('added_p99_ms')}  TTFC {rng('ttfc_p50_ms')}"
            f"  req/s {result['req_per_s'][name]}"
        )
    for name in result["req_per_s"]:
        if name == "direct":
            continue
        tails = [r[name]["tail"] for r in result["runs"]]
        lines.append(
            f"  {name:12s} slowest 1 %: direct also slow in "
            + ", ".join(f"{t['direct_also_slow']}/{t['rounds']}" for t in tails)
            + "; ms over direct "
            + " | ".join(" ".join(f"{v:.1f}" for v in t["minus_direct_ms"]) for t in tails)
        )
    loads = [r["load_avg_1m"]["start"] for r in result["runs"]]
    lines.append(f"  load average (1 min) at the runs' start: {min(loads):.1f}-{max(loads):.1f}")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, default=4, help="kvroute engine processes")
    p.add_argument("--light", type=int, default=0, help="N light engines instead (one process)")
    p.add_argument("--runs", type=int, default=3, help="latency rounds (ranges reported)")
    p.add_argument("--vllm-router-policy", default="round_robin")
    p.add_argument("--requests", type=int, default=400)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument(
        "--vllm-router",
        default=None,
        help="path to a vllm-router binary (default: .venv-peers/vllm-router, if installed)",
    )
    p.add_argument(
        "--router-arg", action="append", default=[], help="extra `kvroute serve` argument"
    )
    p.add_argument("--json", default=None)
    args = p.parse_args()
    result = asyncio.run(run(args))
    report(result, summary(result), args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
