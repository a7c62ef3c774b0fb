"""Router core on Redis (issue 13, round 3): score, ingest and bytes per entry, with the
in-process index as the peer measured in the same run.

* score: ``Scorer.score_result`` over 8k-token prompts (full:16 + swa:16:4096) at each
  worker count, "typical" and "all-hit" fleets as in ``benchmarks/router_core.py``;
  queries alternate between a Redis-backed and a memory-backed scorer fed the same
  events, and every answer must agree. Wall p50/p99 (what a caller sees, server
  included) and the client thread's CPU.
* ingest: block events per second through ``Ingestor.apply_batches`` (16 batches per
  call, as a subscriber draining its queue), Redis then memory on the same stream.
* bytes per (worker, group, block) entry in Redis: ``INFO memory`` before and after
  ingesting, divided by the index's ``entries``, at each worker count.
* ``--cluster``: the same score on a 3-master Redis Cluster started on loopback (workers
  over 16 shards: one script call per node, concurrently) against one redis-server, in
  the same run.

Run: ``python benchmarks/router_core_redis.py [--json] [--quick] [--workers 8,64,256]
[--bytes-workers 8,64,256] [--redis-server valkey-server]`` (starts a private server on
loopback unless ``--redis-url`` is given).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import redis
import redis.asyncio
from router_core import bench_ingest, int_list, make_stream, populate, start_redis

from benchmarks.stats import pct_ms
from router.index import IndexBackend, make_index
from router.score.scorer import Scorer


async def _flush(index: IndexBackend) -> None:
    r = index._r  # type: ignore[attr-defined]
    if index.cluster:  # type: ignore[attr-defined]
        from redis.asyncio.cluster import RedisCluster

        await r.flushall(target_nodes=RedisCluster.PRIMARIES)
    else:
        await r.flushall()


async def _script_usec(index: IndexBackend) -> int:
    """Microseconds the server(s) spent executing EVALSHA so far (INFO commandstats)."""
    r = index._r  # type: ignore[attr-defined]
    if index.cluster:  # type: ignore[attr-defined]
        from redis.asyncio.cluster import RedisCluster

        per_node = await r.info("commandstats", target_nodes=RedisCluster.PRIMARIES)
        stats = list(per_node.values())
    else:
        stats = [await r.info("commandstats")]
    return sum(int(s.get("cmdstat_evalsha", {}).get("usec", 0)) for s in stats)


def start_cluster() -> tuple[list[subprocess.Popen[bytes]], str] | None:
    """Three cluster-enabled redis-servers on loopback joined by ``redis-cli --cluster
    create`` (as tests/router/index/test_cluster.py does)."""
    server, cli = shutil.which("redis-server"), shutil.which("redis-cli")
    if server is None or cli is None:
        return None
    workdir = Path(tempfile.mkdtemp(prefix="kvroute-cluster-"))
    ports = []
    for _ in range(6):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            ports.append(s.getsockname()[1])
    data, bus = ports[:3], ports[3:]
    procs = [
        subprocess.Popen(
            [server, "--port", str(p), "--cluster-port", str(b), "--bind", "127.0.0.1",
             "--cluster-enabled", "yes", "--cluster-config-file", str(workdir / f"n{p}.conf"),
             "--dir", str(workdir), "--save", "", "--appendonly", "no"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        for p, b in zip(data, bus, strict=True)
    ]  # fmt: skip
    deadline = time.monotonic() + 30
    clients = [redis.Redis(host="127.0.0.1", port=p, socket_timeout=5) for p in data]
    for c in clients:
        while True:
            try:
                c.ping()
                break
            except redis.exceptions.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
    subprocess.run(
        [cli, "--cluster", "create", *(f"127.0.0.1:{p}" for p in data), "--cluster-replicas",
         "0", "--cluster-yes"],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    for c in clients:
        while c.cluster("info").get("cluster_state") != "ok":
            if time.monotonic() > deadline:
                raise RuntimeError("the cluster did not reach cluster_state:ok")
            time.sleep(0.05)
    return procs, f"redis+cluster://127.0.0.1:{data[0]}"


async def redis_score(
    url: str, n_workers: int, scenario: str, queries: int, peer_url: str | None = None
) -> dict[str, Any]:
    """Redis and memory scorers on the same fleet, queries alternating (``peer_url``:
    a second Redis, e.g. one server against a cluster, instead of the memory index)."""
    indexes: dict[str, IndexBackend] = {"redis": make_index("redis", url)}
    if peer_url:
        indexes["memory"] = make_index("redis", peer_url)
    else:
        indexes["memory"] = make_index("memory")
    for ix in indexes.values():
        if ix.kind == "redis":
            await _flush(ix)
    prompts: list[list[int]] = []
    for index in indexes.values():
        prompts = await populate(index, n_workers, scenario)
    scorers = {k: Scorer(ix) for k, ix in indexes.items()}
    workers = [f"w{w}" for w in range(n_workers)]
    for s in scorers.values():
        await s.score_result(prompts[0], workers)  # warm: learns the block sizes
    wall: dict[str, list[float]] = {k: [] for k in scorers}
    cpu: dict[str, list[float]] = {k: [] for k in scorers}
    rng = random.Random(3)
    hits = 0
    gc.collect()
    before = await _script_usec(indexes["redis"])
    for _ in range(queries):
        toks = rng.choice(prompts)
        answers = []
        for name, s in scorers.items():
            t0, c0 = time.perf_counter(), time.thread_time()
            answers.append(await s.score_result(toks, workers))
            wall[name].append(time.perf_counter() - t0)
            cpu[name].append(time.thread_time() - c0)
        assert answers[0] == answers[1], "redis and memory disagree"
        hits += sum(1 for w in answers[0].workers if w.hit_tokens)
    after = await _script_usec(indexes["redis"])
    for ix in indexes.values():
        await ix.close()
    out: dict[str, Any] = {"workers": n_workers, "scenario": scenario}
    for k in scorers:
        out[k] = {
            "p50_ms": pct_ms(wall[k], 0.5),
            "p99_ms": pct_ms(wall[k], 0.99),
            "cpu_p50_ms": pct_ms(cpu[k], 0.5),
        }
    out["ratio_p50"] = round(out["redis"]["p50_ms"] / out["memory"]["p50_ms"], 2)
    # Server time per score (EVALSHA execution, summed over the nodes it ran on).
    out["redis"]["server_ms"] = round((after - before) / queries / 1e3, 3)
    out["mean_workers_hit"] = round(hits / queries, 1)
    return out


async def _server_cpu_s(index: IndexBackend) -> float:
    """CPU seconds of the (single) server's main thread so far (INFO cpu): robust to the
    machine's load, unlike wall or ``commandstats`` times."""
    info = await index._r.info("cpu")  # type: ignore[attr-defined]
    return float(info["used_cpu_user_main_thread"]) + float(info["used_cpu_sys_main_thread"])


async def redis_ingest(url: str, block_events: int, capacity: int) -> dict[str, Any]:
    stream, total = make_stream(8, block_events, capacity)
    index = make_index("redis", url)
    await index._r.execute_command("FLUSHALL", "SYNC")  # type: ignore[attr-defined]
    cpu0 = await _server_cpu_s(index)
    got = {"redis": await bench_ingest(index, stream, total, drain=16)}
    server_s = await _server_cpu_s(index) - cpu0
    red = got["redis"]
    red["server_us_per_block_event"] = round(server_s * 1e6 / total, 2)
    red["client_us_per_block_event"] = round(1e6 / red["block_events_per_cpu_s"], 2)
    # Both sides' CPU in series: the rate on a core each with nothing else to run.
    red["block_events_per_cpu_s_both"] = round(
        1e6 / (red["server_us_per_block_event"] + red["client_us_per_block_event"])
    )
    await index.close()
    got["memory"] = await bench_ingest(make_index("memory"), stream, total, drain=16)
    got["ratio"] = round(
        got["redis"]["block_events_per_s"] / got["memory"]["block_events_per_s"], 3
    )
    return got


async def redis_bytes(url: str, n_workers: int, block_events: int, capacity: int) -> dict[str, Any]:
    """``block_events`` stores (about as many entries: no evictions at these sizes)."""
    index = make_index("redis", url)
    r = index._r  # type: ignore[attr-defined]
    await r.execute_command("FLUSHALL", "SYNC")  # Valkey flushes lazily by default
    before = int((await r.info("memory"))["used_memory"])
    stream, total = make_stream(n_workers, block_events, capacity, seed=7)
    await bench_ingest(index, stream, total, drain=16)
    after = int((await r.info("memory"))["used_memory"])
    stats = await index.stats()
    # MEMORY USAGE (every field counted: SAMPLES 0) by key type: the shared rows (x:),
    # the engine-hash maps (e:), everything else.
    parts = {"rows": 0, "maps": 0, "other": 0}
    async for name in r.scan_iter(count=1000):
        used = int(await r.memory_usage(name, samples=0) or 0)
        kind = "rows" if b":x:" in name else "maps" if b":e:" in name else "other"
        parts[kind] += used
    await index.close()
    entries = int(stats["entries"])
    return {
        "workers": n_workers,
        "entries": entries,
        "map_entries": stats["map_entries"],
        "bytes_per_entry": round((after - before) / entries, 1),
        **{f"{k}_per_entry": round(v / entries, 1) for k, v in parts.items()},
    }


async def _server_version(url: str) -> str:
    r = redis.asyncio.Redis.from_url(url)
    info = await r.info("server")
    await r.aclose()
    if "valkey_version" in info:
        return f"valkey {info['valkey_version']}"
    return f"redis {info['redis_version']}"


async def run(args: argparse.Namespace, url: str) -> dict[str, Any]:
    res: dict[str, Any] = {"load": os.getloadavg()[0], "score": [], "bytes": []}
    res["server"] = await _server_version(url)
    res["ingest"] = await redis_ingest(url, args.block_events, args.capacity)
    for n in args.workers:
        for scenario in ("typical", "all-hit"):
            res["score"].append(await redis_score(url, n, scenario, args.queries))
    for n in args.bytes_workers or args.workers:
        res["bytes"].append(await redis_bytes(url, n, args.bytes_entries, args.capacity))
    if args.cluster:
        started = start_cluster()
        if started is None:
            print("redis-cli not available: no cluster figures", file=sys.stderr)
        else:
            procs, cluster_url = started
            try:
                res["cluster"] = [
                    await redis_score(cluster_url, n, "typical", args.queries, peer_url=url)
                    for n in (64,)
                ]
            finally:
                for p in procs:
                    p.kill()
                    p.wait()
    res["load_after"] = os.getloadavg()[0]
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--block-events", type=int, default=200_000)
    ap.add_argument("--capacity", type=int, default=8192, help="blocks per worker and group")
    ap.add_argument("--queries", type=int, default=100)
    ap.add_argument("--workers", type=int_list, default=[8, 64, 256])
    ap.add_argument(
        "--bytes-workers", type=int_list, default=None, help="worker counts of the bytes line"
    )
    ap.add_argument(
        "--bytes-entries",
        type=int,
        default=100_000,
        help="(worker, group, block) entries the bytes line is measured at",
    )
    ap.add_argument("--redis-url", default=None, help="default: start a private server")
    ap.add_argument(
        "--redis-server",
        default="redis-server",
        help="the binary of the private server (e.g. valkey-server)",
    )
    ap.add_argument("--quick", action="store_true", help="small sizes (smoke run)")
    ap.add_argument("--cluster", action="store_true", help="also score on a 3-master cluster")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if args.quick:
        args.block_events, args.queries, args.workers = 20_000, 20, [8, 64]
        args.bytes_entries = 20_000
    proc = None
    url = args.redis_url
    if url is None:
        started = start_redis(args.redis_server)
        if started is None:
            print(f"{args.redis_server} not available", file=sys.stderr)
            return 1
        proc, url = started
    try:
        res = asyncio.run(run(args, url))
    finally:
        if proc is not None:
            proc.kill()
            proc.wait()
    if args.json:
        print(json.dumps(res, indent=2))
        return 0
    print(f"server: {res['server']}")
    print(f"load average (1 min): {res['load']:.1f} before, {res['load_after']:.1f} after")
    ing = res["ingest"]
    for k in ("redis", "memory"):
        r = ing[k]
        print(
            f"ingest {k:<6} {r['block_events_per_s']:>10,} block events/s wall "
            f"({r['block_events_per_cpu_s']:,} per CPU-second of the router thread)"
        )
    r = ing["redis"]
    print(
        f"ingest redis CPU per block event: router {r['client_us_per_block_event']} us + "
        f"redis-server {r['server_us_per_block_event']} us "
        f"({r['block_events_per_cpu_s_both']:,} per CPU-second of both)"
    )
    print(f"ingest redis / memory: {ing['ratio']}")
    for r in res["score"]:
        red, mem = r["redis"], r["memory"]
        print(
            f"score {r['workers']:>3} workers {r['scenario']:<8} "
            f"redis p50 {red['p50_ms']:.3f} p99 {red['p99_ms']:.3f} ms "
            f"(client cpu p50 {red['cpu_p50_ms']:.3f}, server {red['server_ms']:.3f} per score)  "
            f"memory p50 {mem['p50_ms']:.3f} p99 {mem['p99_ms']:.3f} ms  "
            f"redis/memory p50 {r['ratio_p50']}x  workers hit {r['mean_workers_hit']}"
        )
    for r in res.get("cluster", []):
        cl, one = r["redis"], r["memory"]
        print(
            f"cluster {r['workers']:>3} workers {r['scenario']:<8} "
            f"3-master cluster p50 {cl['p50_ms']:.3f} p99 {cl['p99_ms']:.3f} ms "
            f"(server {cl['server_ms']:.3f} summed over nodes)  "
            f"one server p50 {one['p50_ms']:.3f} p99 {one['p99_ms']:.3f} ms  "
            f"cluster/one server p50 {r['ratio_p50']}x"
        )
    for r in res["bytes"]:
        print(
            f"bytes redis {r['workers']:>3} workers: {r['bytes_per_entry']} bytes/entry "
            f"over {r['entries']:,} entries ({r['map_entries']:,} map entries); MEMORY USAGE "
            f"per entry: rows {r['rows_per_entry']}, maps {r['maps_per_entry']}, "
            f"other {r['other_per_entry']}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
