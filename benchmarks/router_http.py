"""``POST /v1/score`` over HTTP: the score half of ``benchmarks/router.py``.

Latency seen by an HTTP client (httpx, keep-alive) against ``kvroute``'s FastAPI app
under uvicorn in a child process (this file with ``--_serve WORKERS PORT``), for 8k-token
prompts over a "typical" fleet of two groups (``router_core.populate``), with the
server's own score time from its ``/metrics`` beside it. Split from ``router.py``, which
runs it after the ingest figures.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import logging
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]

import httpx  # noqa: E402
from router_core import populate  # noqa: E402

from benchmarks.stats import pct_ms  # noqa: E402
from router.config import RouterSettings, WorkerSpec  # noqa: E402
from router.index import make_index  # noqa: E402
from router.netutil import free_ports  # noqa: E402
from router.service import RouterService  # noqa: E402


def child_serve(workers: int, port: int) -> int:
    import uvicorn

    from router.http import create_app

    logging.basicConfig(level=logging.WARNING)
    settings = RouterSettings(port=port, replay_on_connect=False)
    svc = RouterService(settings)
    for w in range(workers):  # never-answering endpoints: scoring needs no live stream
        svc._register(WorkerSpec(worker_id=f"w{w}", endpoint="tcp://127.0.0.1:9"))
    asyncio.run(populate(svc.index, workers, "typical"))
    uvicorn.run(create_app(svc), host="127.0.0.1", port=port, log_level="warning")
    return 0


def bench_http_score(workers: int, queries: int) -> dict[str, Any]:
    port = free_ports(1)[0]
    child = subprocess.Popen(
        [sys.executable, __file__, "--_serve", str(workers), str(port)],
        stdout=subprocess.DEVNULL,
    )
    prompts = asyncio.run(populate(make_index("memory"), 1, "typical"))  # same pool (seeded)
    bodies = [json.dumps({"token_ids": p}).encode() for p in prompts]
    url = f"http://127.0.0.1:{port}"
    try:
        with httpx.Client(base_url=url, timeout=30) as client:
            deadline = time.monotonic() + 60
            while True:
                try:
                    if client.get("/healthz").status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline or child.poll() is not None:
                    raise RuntimeError("score server did not start")
                time.sleep(0.05)
            headers = {"content-type": "application/json"}
            rng = random.Random(5)
            for _ in range(20):  # warm-up: connection, learned block sizes
                client.post("/v1/score", content=rng.choice(bodies), headers=headers)
            lat: list[float] = []
            gc.collect()
            for _ in range(queries):
                body = rng.choice(bodies)
                t0 = time.perf_counter()
                r = client.post("/v1/score", content=body, headers=headers)
                lat.append(time.perf_counter() - t0)
                assert r.status_code == 200, r.text
            metrics = client.get("/metrics").text
    finally:
        child.terminate()
        child.wait(timeout=15)
    server = _histogram_mean_ms(metrics, "kvroute_score_duration_seconds")
    return {
        "workers": workers,
        "groups": 2,
        "prompt_tokens": len(prompts[0]),
        "queries": queries,
        "p50_ms": pct_ms(lat, 0.5),
        "p99_ms": pct_ms(lat, 0.99),
        "server_score_mean_ms": server,
        "response_bytes": len(r.content),
    }


def _histogram_mean_ms(text: str, name: str) -> float | None:
    total = count = None
    for line in text.splitlines():
        if line.startswith(f"{name}_sum "):
            total = float(line.split()[1])
        elif line.startswith(f"{name}_count "):
            count = float(line.split()[1])
    return round(total / count * 1e3, 3) if total is not None and count else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workers", type=int, nargs="+", default=[16, 64])
    ap.add_argument("--queries", type=int, default=300)
    ap.add_argument("--_serve", nargs=2, type=int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args._serve:
        return child_serve(*args._serve)
    print(json.dumps([bench_http_score(w, args.queries) for w in args.workers], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
