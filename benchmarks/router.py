"""Router over the wire: end-to-end ingest through ZMQ and ``/v1/score`` over HTTP.

* ingest: block events per second from real ``ZmqEventPublisher`` instances (in a child
  process, so they do not share the GIL with the router) through the router's SUB
  sockets, sequence tracking and ``Ingestor`` into the index, memory and redis. The
  clock runs from "go" to the last batch applied, so publisher encoding, ZMQ transport,
  decoding and the index write are all inside. Workload: ``router_core.make_stream``
  (hybrid full + sliding-window groups, stores of 1-32 blocks of 16 tokens, evictions).
* score: ``POST /v1/score`` latency seen by an HTTP client (httpx, keep-alive) against
  ``kvroute``'s FastAPI app under uvicorn in a child process, for 8k-token prompts over
  16 and 64 workers with two groups (``router_core.populate``: "typical" fleet); the
  code is in ``benchmarks/router_http.py``.

The in-process figures for the same workloads come from ``benchmarks/router_core.py``.
Targets (issue 4): ingest >= 500k block events/s memory, >= 150k/s redis (end to end
may be lower); score p99 <= 5 ms over HTTP at 64 workers.
Run: ``python benchmarks/router.py [--json] [--quick]``.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import json
import logging
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]

from router_core import make_stream, start_redis  # noqa: E402
from router_http import bench_http_score  # noqa: E402

from router.config import RouterSettings, WorkerSpec  # noqa: E402
from router.index import make_index  # noqa: E402
from router.service import RouterService  # noqa: E402

SEED = 11


# ---------------------------------------------------------------------- child: publishers


def child_publish(workers: int, block_events: int, capacity: int) -> int:
    """Publish ``make_stream`` per worker after a "go" line; report counters at the end."""
    from publisher import ZmqEventPublisher

    stream, total = make_stream(workers, block_events, capacity, seed=SEED)
    per_worker: dict[str, list[Any]] = {f"w{w}": [] for w in range(workers)}
    for worker, b in stream:
        per_worker[worker].append(b)
    big = len(stream) + 10
    pubs = {
        w: ZmqEventPublisher(
            "tcp://127.0.0.1:*",
            replay_endpoint="tcp://127.0.0.1:*",
            topic=f"kv@{w}",
            hwm=big,
            max_queue_size=big,
            buffer_steps=big,
        )
        for w in per_worker
    }
    print(
        json.dumps(
            {
                "total": total,
                "workers": {
                    w: {
                        "endpoint": p.bound_endpoint,
                        "replay": p.bound_replay_endpoint,
                        "batches": len(per_worker[w]),
                    }
                    for w, p in pubs.items()
                },
            }
        ),
        flush=True,
    )
    sys.stdin.readline()  # "go"
    c0 = time.process_time()
    # Interleave workers as a fleet would.
    for i in range(max(len(v) for v in per_worker.values())):
        for w, batches in per_worker.items():
            if i < len(batches):
                pubs[w].publish(batches[i])
    sys.stdin.readline()  # "done": the router has everything
    cpu = time.process_time() - c0  # encoding and sending, all threads
    dropped = sum(p.dropped for p in pubs.values())
    for p in pubs.values():
        p.shutdown(timeout=5)
    print(json.dumps({"dropped": dropped, "cpu_s": cpu}), flush=True)
    return 0


async def bench_ingest(
    kind: str,
    redis_url: str | None,
    workers: int,
    block_events: int,
    capacity: int,
    profile: str | None = None,
) -> dict[str, Any]:
    child = subprocess.Popen(
        [sys.executable, __file__, "--_publish", str(workers), str(block_events), str(capacity)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdin is not None and child.stdout is not None
    try:
        info = json.loads(child.stdout.readline())
        index = make_index(kind, redis_url)
        if kind == "redis":
            await index._r.flushall()  # type: ignore[attr-defined]
        svc = RouterService(RouterSettings(), index=index)
        await svc.start()
        for w, ep in info["workers"].items():
            spec = WorkerSpec(worker_id=w, endpoint=ep["endpoint"], replay_endpoint=ep["replay"])
            await svc.add_worker(spec)
        subs = [svc.subscriptions.get(w) for w in info["workers"]]
        deadline = time.monotonic() + 10
        while not all(s is not None and s.connected for s in subs):
            if time.monotonic() > deadline:
                raise RuntimeError("router did not connect to the publishers")
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.3)  # past the on-connect catch-up: nothing buffered yet
        targets = {w: ep["batches"] - 1 for w, ep in info["workers"].items()}
        gc.collect()
        s0 = await _redis_cpu(index) if kind == "redis" else 0.0
        writes = _time_writes(svc)
        prof = cProfile.Profile() if profile else None
        if prof is not None:
            prof.enable()
        c0, l0 = time.process_time(), time.thread_time()
        t0 = time.perf_counter()
        child.stdin.write("go\n")
        child.stdin.flush()
        while any(
            svc.subscriptions.get(w).last_seq.get(0, -1) < t  # type: ignore[union-attr]
            for w, t in targets.items()
        ):
            await asyncio.sleep(0.002)
            if time.perf_counter() - t0 > 300:
                raise RuntimeError("ingest did not finish")
        dt = time.perf_counter() - t0
        cpu, loop_cpu = time.process_time() - c0, time.thread_time() - l0
        if prof is not None and profile:
            prof.disable()
            prof.dump_stats(f"{profile}.{kind}.{workers}")
        server_cpu = (await _redis_cpu(index)) - s0 if kind == "redis" else None
        child.stdin.write("done\n")
        child.stdin.flush()
        done = json.loads(child.stdout.readline())
        dropped, publisher_cpu = done["dropped"], done["cpu_s"]
        counters = [s.counters for s in subs if s is not None]
        entries = (await svc.index.stats())["entries"]
        await svc.stop()
    finally:
        child.kill()
        child.wait()
    total = info["total"]
    return {
        "backend": kind,
        "publishers": workers,
        "block_events": total,
        "seconds": round(dt, 3),
        # From "go" to the first index write's start, and from the last one's end to
        # the end of the timing: what the window holds besides ingest (start-up, the
        # publishers' first sends, noticing the end).
        "start_s": round(writes[0] - t0, 4) if writes else None,
        "tail_s": round(t0 + dt - writes[1], 4) if writes else None,
        "block_events_per_s": round(total / dt),
        "block_events_per_router_cpu_s": round(total / cpu) if cpu > 0 else None,
        # The event loop's thread alone (the router CPU above adds ZMQ's I/O thread).
        "block_events_per_loop_cpu_s": round(total / loop_cpu) if loop_cpu > 0 else None,
        # redis-server's own CPU (INFO cpu): on 2 shared cores the three processes
        # (publishers, router, redis) compete, so wall time follows their CPU sum.
        "redis_server_cpu_s": round(server_cpu, 3) if server_cpu is not None else None,
        # The publishers' process (from "go" to "done"): wall follows the slower side.
        "router_cpu_s": round(cpu, 3),
        "publisher_cpu_s": round(publisher_cpu, 3),
        "gaps": sum(c.gaps for c in counters),
        "resyncs": sum(c.resyncs for c in counters),
        "publisher_dropped": dropped,
        "index_entries": entries,
    }


def _time_writes(svc: RouterService) -> list[float]:
    """[start of the first, end of the last] ``apply_batch`` call of the service's
    ingestor (the subscribers' writes), filled in as they happen."""
    ing = svc.ingestor
    real = ing.apply_batch
    times: list[float] = []

    async def timed(*args: Any, **kw: Any) -> dict[str, int]:
        t = time.perf_counter()
        got = await real(*args, **kw)
        if not times:
            times[:] = [t, 0.0]
        times[1] = time.perf_counter()
        return got

    ing.apply_batch = timed  # type: ignore[method-assign]
    return times


async def _redis_cpu(index: Any) -> float:
    info = await index._r.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


# ---------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--block-events",
        type=int,
        default=400_000,
        help="memory ingest size (Redis: a quarter); 400k keeps the index's fill phase "
        "(no evictions yet: 16%% of the events with 4 publishers) and the ~3 ms start "
        "small beside the steady state",
    )
    ap.add_argument("--capacity", type=int, default=8192, help="blocks per worker and group")
    ap.add_argument("--publishers", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--queries", type=int, default=300)
    ap.add_argument("--redis-url", default=None, help="default: start a private redis-server")
    ap.add_argument("--no-redis", action="store_true")
    ap.add_argument("--quick", action="store_true", help="small sizes (smoke run)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument(
        "--profile", metavar="OUT", help="cProfile the router's ingest window to OUT.<backend>.<n>"
    )
    ap.add_argument("--no-score", action="store_true", help="ingest only")
    ap.add_argument("--_publish", nargs=3, type=int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args._publish:
        return child_publish(*args._publish)
    logging.basicConfig(level=logging.WARNING)
    if args.quick:
        args.block_events, args.queries, args.publishers = 20_000, 40, [1]
    proc, url = None, None if args.no_redis else args.redis_url
    if not args.no_redis and url is None:
        started = start_redis()
        if started is None:
            print("redis-server not available: redis figures skipped", file=sys.stderr)
        else:
            proc, url = started
    res: dict[str, Any] = {"ingest": [], "score_http": []}
    try:
        for n in args.publishers:
            res["ingest"].append(
                asyncio.run(
                    bench_ingest("memory", None, n, args.block_events, args.capacity, args.profile)
                )
            )
        if url:
            for n in args.publishers:
                events = args.block_events // 4
                res["ingest"].append(asyncio.run(bench_ingest("redis", url, n, events, 8192)))
    finally:
        if proc is not None:
            proc.kill()
            proc.wait()
    for workers in () if args.no_score else (16, 64):
        res["score_http"].append(bench_http_score(workers, args.queries))
    if args.json:
        print(json.dumps(res, indent=2))
        return 0
    for r in res["ingest"]:
        print(
            f"ingest {r['backend']:<6} {r['publishers']} publisher(s) "
            f"{r['block_events_per_s']:>9,} block events/s end to end "
            f"({r['block_events']:,} in {r['seconds']} s; "
            f"{r['block_events_per_router_cpu_s']:,} per router CPU-second, "
            f"{r['block_events_per_loop_cpu_s']:,} per event-loop CPU-second; "
            + (
                f"redis-server CPU {r['redis_server_cpu_s']} s; "
                if r["redis_server_cpu_s"] is not None
                else ""
            )
            + f"first write after {r['start_s']} s, last {r['tail_s']} s before the end; "
            + f"CPU router {r['router_cpu_s']} s, publishers {r['publisher_cpu_s']} s; "
            + f"gaps {r['gaps']}, dropped {r['publisher_dropped']})"
        )
    for r in res["score_http"]:
        print(
            f"score  HTTP {r['workers']:>3} workers x {r['groups']} groups, "
            f"{r['prompt_tokens']}-token prompts: p50 {r['p50_ms']:.3f} ms  "
            f"p99 {r['p99_ms']:.3f} ms  (server-side score mean {r['server_score_mean_ms']} ms)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
