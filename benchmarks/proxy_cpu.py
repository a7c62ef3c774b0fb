"""The router's own CPU at 64 workers: per second while idle (what health checks and
ingestion cost) and per proxied request, read from ``/proc/PID/stat`` so CPU contention
from other processes does not inflate it the way it inflates latencies. With ``--gc``
the router also reports its garbage-collector pauses (benchmarks/gcstats/).

How docs/proxy.md ("Overhead") found the health-check burst and the full collections:
``python benchmarks/proxy_cpu.py [--light 64] [--gc] [--router-arg=--health-interval-s
--router-arg=1000] [--profile OUT.pstats]`` (``--profile``: cProfile of the router's
event loop over the busy phase only, benchmarks/profiling/). Light engines as in
benchmarks/proxy.py; loopback only.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("bench_proxy", REPO / "benchmarks/proxy.py")
assert _spec is not None and _spec.loader is not None
bp = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bp)


def gc_line(log: Path) -> dict[int, tuple[int, float, float]]:
    """The router's last ``GCSTAT`` report: generation -> (count, total ms, max ms)."""
    lines = [ln for ln in log.read_text().splitlines() if ln.startswith("GCSTAT")]
    out: dict[int, tuple[int, float, float]] = {}
    for part in lines[-1].split()[1:] if lines else []:
        gen, _, values = part.partition(":")
        n, ms, mx = (v.split("=")[1] for v in values.split(","))
        out[int(gen[1:])] = (int(n), float(ms), float(mx))
    return out


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def run(args: argparse.Namespace) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="kvroute-bench-proxy-cpu-"))
    procs = []
    try:
        engines, specs = bp.start_fleet(args, tmp, procs)
        (port,) = bp.free_ports(1)
        env = {**os.environ}
        if args.gc:
            env["PYTHONPATH"] = str(REPO / "benchmarks/gcstats")
        elif args.profile:
            env["PYTHONPATH"] = str(REPO / "benchmarks/profiling")
            env["BENCH_PROFILE_OUT"] = str(Path(args.profile).resolve())
        log = tmp / "router.log"
        with log.open("wb") as out:
            router = bp.subprocess.Popen(
                [
                    sys.executable, "-m", "router.cli", "serve", "--port", str(port),
                    "--tokenizer", str(bp.TOKENIZER), "--log-level", "warning",
                    *[a for s in specs for a in ("--worker", s)], *args.router_arg,
                ],
                cwd=REPO, stdout=out, stderr=bp.subprocess.STDOUT, env=env,
            )  # fmt: skip
        procs.append(router)
        url = f"http://127.0.0.1:{port}"
        for e in engines:
            await bp.wait_http(f"{e}/health")
        await bp.wait_http(f"{url}/v1/models")
        await bp.wait_live(url)
        await asyncio.sleep(5.5)  # a GCSTAT line after start-up: the baseline
        gc_before = gc_line(log)
        c0, t0 = cpu_s(router.pid), time.monotonic()
        await asyncio.sleep(args.idle_s)
        idle = 1000 * (cpu_s(router.pid) - c0) / (time.monotonic() - t0)
        print(f"idle: router CPU {idle:.1f} ms per s")
        async with httpx.AsyncClient(timeout=30) as client:

            async def one(i: int) -> float:
                body = {"model": bp.MODEL, "prompt": bp.prompt(i), "max_tokens": 1}
                t = time.perf_counter()
                (await client.post(f"{url}/v1/completions", json=body)).raise_for_status()
                return time.perf_counter() - t

            for i in range(200):
                await one(i)
            if args.profile:
                os.kill(router.pid, signal.SIGUSR1)
                await asyncio.sleep(0.2)
            c0 = cpu_s(router.pid)
            lat = [await one(i) for i in range(args.requests)]
            per = 1e6 * (cpu_s(router.pid) - c0) / args.requests
            if args.profile:
                os.kill(router.pid, signal.SIGUSR2)
                await asyncio.sleep(1.0)
                print(f"profile of the busy phase (with profiler overhead): {args.profile}")
        print(
            f"busy: router CPU {per:.0f} us per request; latency p50 "
            f"{1000 * bp.pct(lat, 0.5):.2f} p99 {1000 * bp.pct(lat, 0.99):.2f} ms"
        )
        if args.gc:
            await asyncio.sleep(5.5)  # the next GCSTAT line covers the whole run
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(10)
    if args.gc:
        after = gc_line(log)
        print("router GC during the idle + busy phases (count, total ms; max ms overall):")
        for g in (0, 1, 2):
            n0, ms0, _ = gc_before.get(g, (0, 0.0, 0.0))
            n1, ms1, mx = after.get(g, (0, 0.0, 0.0))
            print(f"  gen{g}: {n1 - n0} collections, {ms1 - ms0:.0f} ms (max {mx:.1f})")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--light", type=int, default=64, help="light engines (one process)")
    p.add_argument("--workers", type=int, default=0, help="kvroute engines instead of light")
    p.add_argument("--requests", type=int, default=2000)
    p.add_argument("--idle-s", type=float, default=10.0)
    p.add_argument("--gc", action="store_true", help="report the router's GC pauses")
    p.add_argument("--profile", default=None, help="cProfile the busy phase into this file")
    p.add_argument("--router-arg", action="append", default=[], help="extra serve argument")
    args = p.parse_args()
    if args.workers:
        args.light = 0
    asyncio.run(run(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
