"""End to end: real publishers (golden vLLM frames, ours, ``kvroute engine``) -> router.

Everything crosses real sockets: ZMQ PUB/SUB and ROUTER/DEALER on loopback, HTTP to the
router (uvicorn in this loop) and to the engine (a subprocess), and a real redis-server.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
import zmq
from _helpers import (
    FakeEngine,
    batch,
    free_port,
    removed,
    serve_app,
    stop_process,
    stored,
    wait_seq,
    wait_until,
)

from publisher import ZmqEventPublisher
from router.config import RouterSettings, WorkerSpec
from router.http import create_app
from router.service import RouterService
from schemas.hashing import block_hashes, external_hash

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests/fixtures/vllm-0.33"


def settings(**kw: Any) -> RouterSettings:
    return RouterSettings(replay_timeout_s=1.0, **kw)


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with serve_app(create_app(settings=settings())) as c:
        yield c


async def score(c: httpx.AsyncClient, tokens: list[int], **kw: Any) -> dict[str, Any]:
    r = await c.post("/v1/score", json={"token_ids": tokens, **kw})
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


# ------------------------------------------------------------------ golden vLLM frames


async def test_golden_vllm_frames_through_a_pub_socket(client: httpx.AsyncClient):
    frames = msgspec.msgpack.decode((FIXTURES / "frames/live.msgpack").read_bytes())
    manifest = json.loads((FIXTURES / "manifest.json").read_text())
    topic = manifest["frames"]["topic"]
    engine = FakeEngine(replay=False)
    try:
        body = {"worker_id": "vllm", "endpoint": engine.endpoint, "topic": topic[:9]}
        assert (await client.post("/v1/workers", json=body)).status_code == 201
        await engine.wait_subscribed()
        for f in frames[:4]:
            await engine.send_raw(list(f))  # the exact bytes vLLM 0.33 sent
        info = await wait_seq(client, "vllm", 3)
        # One publisher, one seq counter: frame 2 belongs to DP rank 1, and that is no gap.
        assert info["last_seq"] == {"0": 3, "1": 2}
        assert info["gaps"] == 0 and info["resyncs"] == 0 and info["decode_errors"] == 0
        groups = info["groups"]
        # Frame 0: 3 blocks stored, the third removed. Frame 1: tokens 0..63 in group 0
        # (full attention) and group 1 (sliding window 32), block 0 of group 1 removed.
        # Frame 2 (rank 1): blocks 0-1 of group 0 offloaded to CPU, block 0 dropped again.
        # Frame 3: one LoRA block (its own chain) in group 0.
        assert groups["0"] == {
            "kind": "full_attention",
            "block_size": 16,
            "sliding_window": None,
            "blocks_by_medium": {"GPU": 5, "CPU": 1},
        }
        assert groups["1"] == {
            "kind": "sliding_window",
            "block_size": 16,
            "sliding_window": 32,
            "blocks_by_medium": {"GPU": 3},
        }
        # HMA: group 1 lost block 0, outside the window at p=64 -> still a 64-token hit.
        s = (await score(client, list(range(65))))["workers"][0]
        assert (s["hit_tokens"], s["hit_tokens_gpu"]) == (64, 64)
        await engine.send_raw(list(frames[4]))  # AllBlocksCleared
        info = await wait_seq(client, "vllm", 4)
        assert all(not g["blocks_by_medium"] for g in info["groups"].values())
        assert (await score(client, list(range(65))))["workers"][0]["hit_tokens"] == 0
    finally:
        await engine.close()


# ------------------------------------------------------------------ our publisher


def chain_batch(tokens: list[int], bs: int = 16, **kw: Any) -> Any:
    digests = block_hashes(tokens, bs)
    return batch(stored([external_hash(d) for d in digests], tokens, block_size=bs, **kw))


def publisher(endpoint: str = "tcp://127.0.0.1:*", replay: str = "tcp://127.0.0.1:*") -> Any:
    return ZmqEventPublisher(endpoint, replay_endpoint=replay, topic="kv@pub")


async def test_our_publisher_live_and_replay(client: httpx.AsyncClient):
    pub = publisher()
    try:
        prefix = list(range(1000, 1048))
        pub.publish(chain_batch(prefix))  # before the router subscribes: replay finds it
        body = {
            "worker_id": "p0",
            "endpoint": pub.bound_endpoint,
            "replay_endpoint": pub.bound_replay_endpoint,
            "topic": "kv@",
        }
        assert (await client.post("/v1/workers", json=body)).status_code == 201
        info = await wait_seq(client, "p0", 0)
        assert info["hash_mode"] == "engine"  # vLLM's default hashing reproduced
        assert (await score(client, [*prefix, 1]))["workers"][0]["hit_tokens"] == 48
        longer = [*prefix, *range(5000, 5032)]
        digests = block_hashes(longer, 16)
        pub.publish(
            batch(
                stored(
                    [external_hash(d) for d in digests[3:]],
                    longer[48:],
                    parent=external_hash(digests[2]),
                    block_size=16,
                )
            )
        )
        pub.publish(batch(removed([external_hash(digests[4])])))
        await wait_seq(client, "p0", 2)
        s = (await score(client, [*longer, 1]))["workers"][0]
        assert s["hit_tokens"] == 64  # block 4 evicted: the prefix stops at block 3
    finally:
        pub.shutdown()


async def test_our_publisher_restart_resyncs(client: httpx.AsyncClient):
    pub = publisher()
    endpoint, replay = pub.bound_endpoint, pub.bound_replay_endpoint
    old = [list(range(i * 100, i * 100 + 32)) for i in range(3)]
    try:
        body = {"worker_id": "p0", "endpoint": endpoint, "replay_endpoint": replay}
        assert (await client.post("/v1/workers", json=body)).status_code == 201
        for tokens in old:
            pub.publish(chain_batch(tokens))
        await wait_seq(client, "p0", 2)
    finally:
        pub.shutdown()
    # Same port, a new process: seq from 0. ("*" makes it bind, as vLLM's rule says.)
    pub = await rebind(endpoint.replace("127.0.0.1", "*"), replay)
    try:
        fresh = list(range(9000, 9032))
        pub.publish(chain_batch(fresh))
        pub.publish(chain_batch(list(range(9100, 9132))))
        info = await wait_until(lambda: _resynced(client), what="resync after restart")
        assert info["last_seq"]["0"] == 1
        assert (await score(client, [*fresh, 1]))["workers"][0]["hit_tokens"] == 32
        for tokens in old:
            assert (await score(client, [*tokens, 1]))["workers"][0]["hit_tokens"] == 0
    finally:
        pub.shutdown()


async def rebind(endpoint: str, replay: str) -> Any:
    """A publisher on the ports a just-closed one used (ZMQ frees them asynchronously)."""
    deadline = time.monotonic() + 10
    while True:
        try:
            return publisher(endpoint, replay)
        except zmq.ZMQError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.05)


async def _resynced(c: httpx.AsyncClient) -> dict[str, Any] | None:
    info = (await c.get("/v1/workers/p0")).json()
    return info if info["resyncs"] == 1 and info["last_seq"].get("0") == 1 else None


# ------------------------------------------------------------------ kvroute engine


@pytest.fixture
def engine_proc(tmp_path: Path) -> Iterator[dict[str, Any]]:
    http, pub, rep = free_port(), free_port(), free_port()
    log = open(tmp_path / "engine.log", "wb")  # noqa: SIM115 - closed below
    args = [sys.executable, "-m", "router.cli", "engine", "--port", str(http)]
    args += [
        "--worker-id",
        "eng0",
        "--publish",
        f"tcp://127.0.0.1:{pub}",
        "--replay",
        f"tcp://127.0.0.1:{rep}",
    ]
    args += ["--gpu-blocks", "24", "--cpu-blocks", "24", "--groups", "full:16,swa:16:48"]
    args += ["--device", "cpu", "--log-level", "warning"]
    proc = subprocess.Popen(args, cwd=REPO, stdout=log, stderr=log)
    info = {
        "http": f"http://127.0.0.1:{http}",
        "endpoint": f"tcp://127.0.0.1:{pub}",
        "replay": f"tcp://127.0.0.1:{rep}",
        "log": tmp_path / "engine.log",
        "proc": proc,
    }
    try:
        yield info
    finally:
        stop_process(proc)
        log.close()


async def test_kvroute_engine_scores_equal_cached_tokens(
    client: httpx.AsyncClient, engine_proc: dict[str, Any]
):
    eng = httpx.AsyncClient(base_url=engine_proc["http"], timeout=30)

    async def engine_up() -> bool:
        if engine_proc["proc"].poll() is not None:
            raise AssertionError(engine_proc["log"].read_text())
        try:
            r = await eng.get("/health")
            # Our engine, not another suite's server that took the port first.
            return r.status_code == 200 and r.json().get("worker_id") == "eng0"
        except (httpx.HTTPError, ValueError):
            return False

    await wait_until(engine_up, timeout=90, what="kvroute engine up")
    body = {
        "worker_id": "eng0",
        "endpoint": engine_proc["endpoint"],
        "replay_endpoint": engine_proc["replay"],
        "topic": "kv@eng0",
    }
    assert (await client.post("/v1/workers", json=body)).status_code == 201
    system = list(range(10_000, 10_080))  # 5 blocks shared by every prompt
    prompts = []
    for turn in range(4):
        for user in range(3):
            tail = [20_000 + user * 1000 + t for t in range(16 * (turn + 1) + user * 3)]
            prompts.append([*system, *tail])
    prompts.append(prompts[0])  # after pressure: evicted / offloaded blocks
    compared = []
    try:
        for prompt in prompts:
            await _caught_up(client, eng)
            est = (await score(client, prompt))["workers"][0]
            r = await eng.post("/v1/completions", json={"prompt": prompt, "max_tokens": 1})
            assert r.status_code == 200, r.text
            got = r.json()
            cached = got["usage"]["prompt_tokens_details"]["cached_tokens"]
            compared.append((est["hit_tokens"], cached, est["hit_tokens_gpu"], got["kv"]))
        assert [c[0] for c in compared] == [c[1] for c in compared], compared
        assert sum(c[1] for c in compared) > 0
        stats = (await eng.get("/stats")).json()
        assert stats["gpu_evictions"] > 0 and stats["offloaded_blocks"] > 0  # real pressure
    finally:
        await eng.aclose()


async def _caught_up(c: httpx.AsyncClient, eng: httpx.AsyncClient) -> None:
    async def done() -> bool:
        pub = (await eng.get("/stats")).json()["publisher"]
        if pub["queued"]:
            return False
        info = (await c.get("/v1/workers/eng0")).json()
        return pub["published"] == 0 or info["last_seq"].get("0") == pub["published"] - 1

    await wait_until(done, what="router caught up with the engine's events")


# ------------------------------------------------------------------ memory vs redis


async def test_memory_and_redis_score_identically_and_redis_survives_restart(redis_url: str):
    engines = {"w0": FakeEngine(), "w1": FakeEngine()}
    services = [
        RouterService(settings()),
        RouterService(settings(index="redis", redis_url=redis_url)),
    ]
    try:
        for svc in services:
            await svc.start()
            for wid, eng in engines.items():
                await svc.add_worker(WorkerSpec(**eng.spec(wid)))
        for eng in engines.values():
            await eng.wait_subscribed(2)
            await wait_until(lambda e=eng: len(e.replay_requests) == 2, what="catch-up replays")
        toks = list(range(96))
        full = dict(block_size=16, group=0, kind="full_attention")
        swa = dict(block_size=16, group=1, kind="sliding_window", window=32)  # 2 blocks
        mamba = dict(block_size=16, group=2, kind="mamba")
        # w0: full + SWA; SWA block 0 evicted (outside the window later); blocks 0-1
        # offloaded to CPU and then evicted from GPU.
        e0 = engines["w0"]
        hs = [101, 102, 103, 104]
        await e0.publish(batch(stored(hs, toks[:64], **full), stored(hs, toks[:64], **swa)))
        await e0.publish(batch(removed([101], group=1)))
        await e0.publish(batch(stored(hs[:2], [], **full, medium="CPU")))
        await e0.publish(batch(removed([101, 102], group=0)))
        # w1: full + SWA with a hole (block 3) + mamba states at 32 and 64 tokens.
        e1 = engines["w1"]
        h1 = [201, 202, 203, 204, 205, 206]
        await e1.publish(batch(stored(h1, toks, **full), stored(h1, toks, **swa)))
        await e1.publish(batch(removed([204], group=1)))
        await e1.publish(
            batch(
                stored([202], toks[16:32], parent=201, **mamba),
                stored([204], toks[48:64], parent=203, **mamba),
            )
        )
        for svc in services:
            for wid, last in (("w0", 3), ("w1", 2)):
                sub = svc.subscriptions.get(wid)
                assert sub is not None
                await wait_until(lambda s=sub, n=last: s.last_seq.get(0) == n, what="caught up")
        requests = [[*toks[:n], 999] for n in (16, 32, 48, 64, 96)] + [toks[:17], list(range(9))]

        async def answers(svc: RouterService) -> list[Any]:
            return [(await svc.score(r, [w])).model_dump() for r in requests for w in engines]

        got = [await answers(svc) for svc in services]
        assert got[0] == got[1]
        hits = {
            (a["workers"][0]["worker_id"], a["request_tokens"]): (
                a["workers"][0]["hit_tokens"],
                a["workers"][0]["hit_tokens_gpu"],
            )
            for a in got[0]
        }
        # GPU copies of w0's blocks 0-1 evicted, CPU copies remain: hits on any tier only;
        # its evicted SWA block 0 is outside the window at 48 and 64 tokens.
        assert hits["w0", 49] == (48, 0) and hits["w0", 65] == (64, 0)
        # w1: the SWA hole at block 3 and mamba states only at 32/64 pull the hit to 32.
        assert hits["w1", 97] == (32, 32) and hits["w1", 65] == (32, 32)
        assert hits["w1", 17] == (0, 0)  # no mamba state at 16 tokens
        await services[1].stop()
        # A new router on the same Redis answers the same without re-ingesting anything.
        again = RouterService(settings(index="redis", redis_url=redis_url, replay_on_connect=False))
        services[1] = again
        await again.start()
        # The REST registrations were kept in Redis: the new router registers them itself.
        assert again.worker_ids() == sorted(engines)
        assert await answers(again) == got[1]
    finally:
        for svc in services:
            await svc.stop()
        for eng in engines.values():
            await eng.close()
