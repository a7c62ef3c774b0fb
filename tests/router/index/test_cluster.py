"""The Redis index on a real 3-master Redis Cluster (started on loopback here), and the
score's round trips: one script call per score on one server, one per node on a cluster.

Two router replicas (two ``RedisIndex`` instances, each with its own ingestor and
scorer) share the cluster: one ingests, both answer, and both answer exactly like the
in-process index fed the same events.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from _kv_streams import EventSource, Harness, feed_hybrid_fleet, tokens

from router.index import make_index
from router.netutil import free_ports

START_DEADLINE_S = 30.0
N_WORKERS = 12
BS = 16


def _evalsha_calls(client: redis.Redis) -> int:
    stats = client.info("commandstats")
    return int(stats.get("cmdstat_evalsha", {}).get("calls", 0))


@pytest.fixture(scope="module")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[int]]:
    """Three cluster-enabled redis-servers joined by ``redis-cli --cluster create``
    (no replicas); yields their ports."""
    server, cli = shutil.which("redis-server"), shutil.which("redis-cli")
    if server is None or cli is None:
        pytest.fail("redis-server and redis-cli are needed (`make system-deps`)", pytrace=False)
    ports = free_ports(6)
    data, bus = ports[:3], ports[3:]
    workdir: Path = tmp_path_factory.mktemp("cluster")
    procs = [
        subprocess.Popen(
            [
                server,
                "--port", str(p),
                "--cluster-port", str(b),
                "--bind", "127.0.0.1",
                "--cluster-enabled", "yes",
                "--cluster-config-file", str(workdir / f"nodes-{p}.conf"),
                "--dir", str(workdir),
                "--save", "",
                "--appendonly", "no",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for p, b in zip(data, bus, strict=True)
    ]  # fmt: skip
    clients = [redis.Redis(host="127.0.0.1", port=p, socket_timeout=5) for p in data]
    try:
        deadline = time.monotonic() + START_DEADLINE_S
        for c in clients:
            while True:
                try:
                    c.ping()
                    break
                except redis.exceptions.ConnectionError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.02)
        subprocess.run(
            [
                cli,
                "--cluster",
                "create",
                *(f"127.0.0.1:{p}" for p in data),
                "--cluster-replicas",
                "0",
                "--cluster-yes",
            ],
            check=True,
            capture_output=True,
            timeout=60,
        )
        for c in clients:  # every node must see the whole cluster before tests start
            while c.cluster("info").get("cluster_state") != "ok":
                if time.monotonic() > deadline:
                    pytest.fail("the cluster did not reach cluster_state:ok", pytrace=False)
                time.sleep(0.05)
        yield data
    finally:
        for proc in procs:
            proc.kill()
            proc.wait(timeout=10)


async def test_two_replicas_on_a_cluster_answer_alike_with_one_call_per_node(
    redis_cluster: list[int],
) -> None:
    url = f"redis+cluster://127.0.0.1:{redis_cluster[0]}"
    nodes = [redis.Redis(host="127.0.0.1", port=p, socket_timeout=5) for p in redis_cluster]
    for n in nodes:
        n.flushall()
    a = Harness.build(make_index("redis", url))
    b = Harness.build(make_index("redis", url))
    ref = Harness.build(make_index("memory"))
    try:
        # replica a ingests; b only reads
        prompts = await feed_hybrid_fleet([a, ref], n_workers=N_WORKERS, seed=1)
        workers = [f"w{w}" for w in range(N_WORKERS)]
        holding = [n for n in nodes if n.dbsize()]
        assert len(holding) >= 2  # the workers' shards are spread over the nodes
        assert sorted(await b.index.known_workers()) == sorted(workers)
        await b.scorer.score_result(prompts[0], workers)  # learns the block sizes
        hits = 0
        for toks in prompts:
            before = [_evalsha_calls(n) for n in nodes]
            got_b = await b.scorer.score_result(toks, [*workers, "unknown"])
            after = [_evalsha_calls(n) for n in nodes]
            # one script call per node holding asked-about shards, none elsewhere
            calls = [y - x for x, y in zip(before, after, strict=True)]
            assert sorted(calls, reverse=True)[: len(holding)] == [1] * len(holding)
            assert sum(calls) <= len(nodes)
            got_a = await a.scorer.score_result(toks, [*workers, "unknown"])
            want = await ref.scorer.score_result(toks, [*workers, "unknown"])
            assert got_b == got_a == want
            hits += sum(1 for r in want.workers if r.hit_tokens)
        assert hits >= N_WORKERS  # the comparison was about real hits
        # A third router whose very first command is a score (the client learns the
        # cluster's slot map on that call).
        c = Harness.build(make_index("redis", url))
        try:
            got_c = await c.scorer.score_result(prompts[0], [*workers, "unknown"])
            assert got_c == await ref.scorer.score_result(prompts[0], [*workers, "unknown"])
        finally:
            await c.index.close()
        stats = await b.index.stats()
        assert stats["workers"] == N_WORKERS and int(stats["entries"]) > 0
        assert int(stats["bytes"]) > sum(int(n.info("memory")["used_memory"]) for n in nodes) / 2
        await a.index.remove_worker("w0")
        assert (await b.scorer.score_result(prompts[0], ["w0"])).workers[0].learned is False
    finally:
        for h in (a, b, ref):
            await h.index.close()


async def test_one_script_call_per_score_on_one_server(redis_url: str) -> None:
    """Scoring 40 workers costs one EVALSHA on a single server (it was one per worker)."""
    index = make_index("redis", redis_url)
    h = Harness.build(index)
    client = redis.Redis.from_url(redis_url)
    try:
        src = EventSource("engine")
        toks = tokens(8 * BS + 1)
        for w in range(40):
            stop = 1 + w % 8
            await h.feed(f"w{w}", src.store(toks, BS, 0, stop, group=0, kind="full_attention"))
        workers = [f"w{w}" for w in range(40)]
        await h.scorer.score_result(toks, workers)  # learns the block size
        before = _evalsha_calls(client)
        res = await h.scorer.score_result(toks, workers)
        assert _evalsha_calls(client) - before == 1
        assert {r.hit_tokens for r in res.workers} == {16 * k for k in range(1, 9)}
    finally:
        await index.close()
        client.close()
