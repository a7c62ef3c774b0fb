"""Packed token ids over real ZMQ sockets: a stream through the subscriber on the
compiled core (stores decoded packed, keys chained from the bytes) leaves the index and
counters the pure-Python core leaves, odd stores (salted, extra keys, wide and
non-int tokens) included."""

from __future__ import annotations

import dataclasses
import random
from typing import Any

import pytest
from _helpers import FakeEngine, subscribe, wait_until

from router.config import RouterSettings
from router.index.memory import MemoryIndex
from router.ingest import packed
from router.service import RouterService
from schemas import BlockRemoved, BlockStored, KVEventBatch, encode_batch

BS = 16


def _payloads(seed: int = 5, n: int = 60) -> list[bytes]:
    rng = random.Random(seed)
    alive: list[int] = []
    out: list[bytes] = []
    for i in range(n):
        events: list[Any] = []
        for _ in range(rng.randint(1, 3)):
            k = rng.randint(1, 6)
            hashes = [rng.getrandbits(64) for _ in range(k)]
            parent = rng.choice(alive) if alive and rng.random() < 0.6 else None
            toks = [rng.randrange(150_000) for _ in range(k * BS)]
            extra: Any = None
            kw: dict[str, Any] = {}
            odd = rng.random()
            if odd < 0.05:
                toks[0] = 2**40  # wider than int32: the usual decode
            elif odd < 0.1:
                kw["cache_salt"] = "salt"
            elif odd < 0.15:
                extra = [[("mm", 1)]] * k
            for g in (0, 1):
                events.append(
                    BlockStored(hashes, parent, toks, BS, None, "GPU", None, extra, g, **kw)
                )
            alive += hashes
        if len(alive) > 40:
            gone, alive = alive[:8], alive[8:]
            events += [BlockRemoved(gone, "GPU", g) for g in (0, 1)]
        payload = encode_batch(KVEventBatch(float(i), events))
        if i == n // 2:  # a store whose tokens are not ints: counted, never applied
            bad = BlockStored([1], None, ["x"] * BS, BS, None, "GPU", None, group_idx=0)
            out.append(encode_batch(KVEventBatch(float(i), [bad])))
        out.append(payload)
    return out


def _snapshot(svc: RouterService) -> dict[str, Any]:
    index = svc.index
    assert isinstance(index, MemoryIndex)
    sub = svc.subscriptions.get("w0")
    assert sub is not None
    w = index._workers["w0"]
    return {
        "tables": {g: dict(t.items()) for g, t in index._tables.items()},
        "maps": {bs: dict(m.items()) for bs, m in w.maps.items()},
        "counts": w.counts,
        "entries": w.entries,
        "seqs": w.seqs,
        # ``batches`` counts index calls: how many frames a drain turn merged (timing).
        "ingest": dataclasses.replace(svc.ingestor.counters, batches=0),
        "decode": sub.decode_stats,
        "recent": [(packed.tokens(t), u) for t, u in svc.ingestor._recent["w0"]],
    }


async def _run(payloads: list[bytes], monkeypatch: pytest.MonkeyPatch) -> tuple[dict, int]:
    taken = 0
    real = packed.decode

    def spy(payload: bytes) -> Any:
        nonlocal taken
        got = real(payload)
        taken += got is not None
        return got

    monkeypatch.setattr(packed, "decode", spy)
    engine = FakeEngine()
    svc = RouterService(RouterSettings(replay_timeout_s=1.0))
    await svc.start()
    try:
        sub = await subscribe(svc, engine, synced=True)
        for p in payloads:
            await engine.publish_payload(p)
        last = len(payloads) - 1
        await wait_until(lambda: sub.last_seq.get(0, -1) >= last, what="all applied")
        return _snapshot(svc), taken
    finally:
        await svc.stop()
        await engine.close()
        monkeypatch.setattr(packed, "decode", real)


async def test_packed_stream_equals_the_python_core(monkeypatch: pytest.MonkeyPatch) -> None:
    from router import native

    if not native.available() or native._core is None or not hasattr(native._core, "chain_packed"):
        pytest.skip("compiled core with libxxhash not built")
    payloads = _payloads()
    before = native.ACTIVE != "python"
    try:
        native.set_active(True)
        fast, taken = await _run(payloads, monkeypatch)
        native.set_active(False)
        plain, none = await _run(payloads, monkeypatch)
    finally:
        native.set_active(before)
    assert none == 0  # the Python core decodes as before
    assert len(payloads) // 2 < taken < len(payloads)  # most frames packed, odd ones not
    assert fast["decode"].malformed_events == 1
    assert fast["ingest"].events_stored > 0 and fast["tables"]
    assert fast == plain
