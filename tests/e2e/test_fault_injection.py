"""Fault injection over real sockets and a real redis-server: the index ends equal to the
engine's stream, or the router says why not.

Each scenario drives a seeded engine-like stream (stores of multi-turn prefixes, evictions,
copies) through a ``FakeEngine`` (XPUB + replay ROUTER we control) into a running
``RouterService``, injects a fault, and ends by comparing every probe's ``hit_tokens``
with a reference: the same ingest and scoring code fed the complete stream directly, in
order, with nothing lost (what the engine's cache holds). Zero unannounced divergence:
either the answers are equal, or the fault is counted (gaps, resyncs, decode errors,
index losses) and the worker flagged.
"""

from __future__ import annotations

import random
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "router"))
from _helpers import FakeEngine, wait_until
from _kv_streams import EventSource, Harness, tokens
from _redis import start_redis_server

from router.config import RouterSettings, WorkerSpec
from router.index import make_index
from router.netutil import free_port
from router.service import RouterService
from schemas import AllBlocksCleared, KVEventBatch

BS = 16
W = "w0"


class Stream:
    """A seeded engine: conversations grow turn by turn, blocks get evicted, some blocks
    are stored twice (vLLM keeps copies). Yields event batches; ``probes`` are prompts."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.src = EventSource()
        self.convs = [tokens(BS * 2, seed=seed * 100 + i) for i in range(6)]
        self.held: dict[int, int] = {}  # conversation -> blocks stored so far

    def batch(self) -> KVEventBatch:
        rng = self.rng
        events: list[Any] = []
        for _ in range(rng.randint(1, 3)):
            c = rng.randrange(len(self.convs))
            toks = self.convs[c]
            if rng.random() < 0.7 or not self.held.get(c):
                toks += tokens(BS * rng.randint(1, 2), seed=rng.randrange(10**9))
                start = self.held.get(c, 0)
                stop = len(toks) // BS
                if rng.random() < 0.15 and start > 0:
                    start -= 1  # the last block recomputed: a second copy
                events.append(self.src.store(toks, BS, start, stop))
                self.held[c] = stop
            else:  # evict the tail block of a conversation
                n = self.held[c]
                events.append(self.src.remove(toks, BS, [n - 1]))
                self.held[c] = n - 1
        return KVEventBatch(time.time(), events, 0)

    def probes(self) -> list[list[int]]:
        out = []
        for toks in self.convs:
            for n in (BS + 1, len(toks) // 2, len(toks)):
                out.append(toks[:n])
        return out


async def compare(svc: RouterService, ref: Harness, stream: Stream) -> list[tuple[int, int]]:
    diffs = []
    for probe in stream.probes():
        got = (await svc.score(probe, [W])).workers[0].hit_tokens
        want = (await ref.one(probe, W)).hit_tokens
        if got != want:
            diffs.append((got, want))
    return diffs


@pytest.fixture
async def engine() -> AsyncIterator[FakeEngine]:
    eng = FakeEngine(buffer=100_000)
    yield eng
    await eng.close()


async def start_router(engine: FakeEngine, **settings: Any) -> RouterService:
    svc = RouterService(RouterSettings(replay_timeout_s=2, tail_check_s=0.3, **settings))
    await svc.start()
    await svc.add_worker(WorkerSpec(**engine.spec(W)))
    await engine.wait_subscribed()
    return svc


async def settle(svc: RouterService, engine: FakeEngine) -> None:
    sub = svc.subscriptions.get(W)
    assert sub is not None
    last = engine.next_seq - 1
    await wait_until(lambda: sub.last_seq.get(0) == last, what=f"seq {last} applied", timeout=30)


async def test_dropped_frames_are_replayed(engine: FakeEngine) -> None:
    """10% of PUB frames never arrive (tail included): gaps and the idle tail check
    replay them from the publisher's buffer."""
    svc = await start_router(engine)
    ref = Harness.build(make_index("memory"))
    stream = Stream(1)
    rng = random.Random(7)
    try:
        for _ in range(300):
            b = stream.batch()
            await ref.ingestor.apply_batch(W, b)
            await engine.publish(b, deliver=rng.random() >= 0.1)
        await settle(svc, engine)
        assert await compare(svc, ref, stream) == []
        sub = svc.subscriptions.get(W)
        assert sub is not None and sub.counters.gaps > 0 and sub.counters.resyncs == 0
    finally:
        await svc.stop()


async def test_publisher_restarts_resync(engine: FakeEngine) -> None:
    """Three publisher restarts: a new process has an empty cache and counts from 0."""
    svc = await start_router(engine)
    ref = Harness.build(make_index("memory"))
    stream = Stream(2)
    try:
        for round_ in range(4):
            if round_:
                engine.restart_seq()
                stream = Stream(10 + round_)
                await ref.ingestor.clear_worker(W)
            for _ in range(80 + 7 * round_):  # a seq no earlier round ended at
                b = stream.batch()
                await ref.ingestor.apply_batch(W, b)
                await engine.publish(b)
            await settle(svc, engine)
            assert await compare(svc, ref, stream) == []
        sub = svc.subscriptions.get(W)
        assert sub is not None and sub.counters.resyncs >= 3
    finally:
        await svc.stop()


async def test_malformed_frames_never_touch_the_index(engine: FakeEngine) -> None:
    """10,000 malformed frames (wrong frame counts, short seqs, random bytes, truncated
    msgpack, wrong types, negative sizes and groups) among a valid stream."""
    svc = await start_router(engine)
    ref = Harness.build(make_index("memory"))
    stream = Stream(3)
    rng = random.Random(9)
    junk = [
        lambda: [rng.randbytes(rng.randint(0, 40))],
        lambda: [b"", rng.randbytes(3), rng.randbytes(20)],
        lambda: [b"", b"", b"", b"", b"x"],
    ]
    bad_payloads = [
        b"\xc1",
        b"\x93\xcb",  # truncated msgpack
        b"\x93\xa1x\x90\xc0",  # wrong types
        # a BlockStored map with a negative block size and a negative group
        b"\x93\xcb\x00\x00\x00\x00\x00\x00\x00\x00\x91\x87\xa4type\xabBlockStored"
        b"\xacblock_hashes\x91\x01\xb1parent_block_hash\xc0\xa9token_ids\x90"
        b"\xaablock_size\xff\xa6medium\xa3GPU\xa9group_idx\xff\x00",
    ]
    sub = svc.subscriptions.get(W)
    assert sub is not None
    try:
        for i in range(10_000):
            await engine.send_raw(rng.choice(junk)())
            if i % 200 == 199:  # paced: a PUB drops what exceeds its high-water mark
                await wait_until(lambda n=i: sub.counters.decode_errors >= n - 50)
            if i % 50 == 0:
                b = stream.batch()
                await ref.ingestor.apply_batch(W, b)
                await engine.publish(b)
            if i % 500 == 0:  # undecodable at the source too: consumes a seq
                await engine.publish_payload(bad_payloads[(i // 500) % len(bad_payloads)])
        await settle(svc, engine)
        assert await compare(svc, ref, stream) == []
        assert sub.counters.decode_errors >= 10_000 - 50
        assert sub.counters.resyncs == 0
    finally:
        await svc.stop()


def _redis(port: int) -> subprocess.Popen[bytes]:
    return start_redis_server("redis-server", port).proc


async def test_redis_restarted_empty_mid_stream(engine: FakeEngine) -> None:
    """redis-server killed and started again with nothing: 503 meanwhile, then the
    router notices the lost content and rebuilds from the publisher's buffer."""
    port = free_port()
    proc = _redis(port)
    url = f"redis://127.0.0.1:{port}/0"
    svc = await start_router(
        engine, index="redis", redis_url=url, index_check_s=0.2, ingest_retry_max_s=0.2
    )
    ref = Harness.build(make_index("memory"))
    stream = Stream(4)
    try:
        for _ in range(100):
            b = stream.batch()
            await ref.ingestor.apply_batch(W, b)
            await engine.publish(b)
        await settle(svc, engine)
        assert await compare(svc, ref, stream) == []
        proc.kill()
        proc.wait(timeout=10)
        assert not await svc.ready()
        for _ in range(20):  # published during the outage
            b = stream.batch()
            await ref.ingestor.apply_batch(W, b)
            await engine.publish(b)
        started = time.monotonic()
        proc = _redis(port)
        await settle(svc, engine)

        async def recovered() -> bool:
            return await compare(svc, ref, stream) == []

        await wait_until(recovered, what="index rebuilt after Redis came back empty", timeout=30)
        recovery_s = time.monotonic() - started
        assert svc.index_watch is not None and svc.index_watch.losses >= 1
        info = await svc.worker_info(W)
        assert info.resyncs >= 1 and not info.partial_history
        print(f"recovery after an empty Redis: {recovery_s:.2f} s")
    finally:
        await svc.stop()
        proc.kill()


async def test_engine_clear_is_followed(engine: FakeEngine) -> None:
    """An engine that resets its prefix cache (AllBlocksCleared) mid-stream."""
    svc = await start_router(engine)
    ref = Harness.build(make_index("memory"))
    stream = Stream(5)
    try:
        for i in range(120):
            b = stream.batch()
            if i == 60:
                b.events.insert(0, AllBlocksCleared())
                stream.held.clear()
            await ref.ingestor.apply_batch(W, b)
            await engine.publish(b)
        await settle(svc, engine)
        assert await compare(svc, ref, stream) == []
    finally:
        await svc.stop()
