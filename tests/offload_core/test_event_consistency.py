"""Event-stream consistency: replaying everything the engine published into an empty
(group, medium, hash) multiset reproduces exactly what its GPU pool and CPU tier hold
(vLLM does not de-duplicate: a key may be stored once per copy and is removed once per
evicted copy), and the hit computed from that state alone is the hit the engine reports
(for layouts without sub-block partial-hash hits, which block masks cannot express)."""

from __future__ import annotations

import contextlib
import random
import time
from collections import Counter

import pytest
import zmq

from offload_core.engine import EngineConfig, RequestTooLargeError, SimEngine
from offload_core.kv_cache import request_lora
from publisher import EventPublisher, ZmqEventPublisher
from schemas import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    decode_batch,
    encode_batch,
)
from schemas.hashing import block_hashes, external_hash, hash_block
from schemas.hit_rule import longest_hit

State = Counter[tuple[int, str, int]]


class WireCapture(EventPublisher):
    """Keeps each batch as the bytes a subscriber would decode (a test sink)."""

    def __init__(self) -> None:
        super().__init__()
        self.payloads: list[bytes] = []

    def publish(self, batch: KVEventBatch) -> None:
        self.payloads.append(encode_batch(batch))

    def shutdown(self, timeout: float = 1.0) -> None:
        return


def apply(state: State, batch: KVEventBatch) -> None:
    """Replay one batch into a multiset; removing a copy that was never stored is an error."""
    for ev in batch.events:
        if isinstance(ev, AllBlocksCleared):
            state.clear()
            continue
        assert ev.group_idx is not None and ev.medium in ("GPU", "CPU")
        for h in ev.block_hashes:
            assert isinstance(h, int)
            entry = (ev.group_idx, ev.medium, h)
            if isinstance(ev, BlockStored):
                state[entry] += 1
            else:
                assert isinstance(ev, BlockRemoved)
                assert state[entry] > 0, f"removed but never stored: {entry}"
                state[entry] -= 1
                if not state[entry]:
                    del state[entry]


def _tuples(x: object) -> object:
    return tuple(_tuples(i) for i in x) if isinstance(x, list | tuple) else x


class Rehasher:
    """Checks that a consumer can re-derive every stored hash from the event's tokens,
    parent and extra keys (what a router's engine-hash detection relies on)."""

    def __init__(self, unit: int) -> None:
        self.unit = unit  # hashes chain per hash unit: only unit-sized blocks re-hash alone
        self.digests: dict[int, bytes] = {}
        self.verified = {"GPU": 0, "CPU": 0}

    def check(self, batch: KVEventBatch) -> None:
        for ev in batch.events:
            if not isinstance(ev, BlockStored):
                continue
            b = ev.block_size
            if b != self.unit:
                continue
            if len(ev.token_ids) != b * len(ev.block_hashes):
                continue  # a sparse store: tokens span masked-out blocks too (as in vLLM)
            if ev.extra_keys and any(ev.extra_keys):
                continue  # published untagged (as vLLM does): not re-hashable alone
            if ev.parent_block_hash is None:
                parent = None
            elif ev.parent_block_hash in self.digests:
                parent = self.digests[ev.parent_block_hash]
            else:
                continue  # parent announced before a reset we did not see: skip
            for i, h in enumerate(ev.block_hashes):
                extra = ev.extra_keys[i] if ev.extra_keys else None
                tokens = ev.token_ids[i * b : (i + 1) * b]
                parent = hash_block(parent, tokens, _tuples(extra))  # type: ignore[arg-type]
                assert external_hash(parent) == h
                self.digests[h] = parent
                self.verified[ev.medium or ""] += 1


def hit_from_state(engine: SimEngine, state: State, prompt: list[int], salt, lora) -> int:
    """What a router holding only the replayed events predicts (any tier)."""
    cached = []
    unit = engine.kv.hash_block_size  # vLLM chains hashes per unit; a block's is its last
    chain = block_hashes(prompt, unit, "sha256", salt, request_lora(lora))
    for g, spec in enumerate(engine.groups):
        scale = spec.block_size // unit
        digests = chain[scale - 1 :: scale]
        ints = [external_hash(d) for d in digests]
        cached.append([(g, "GPU", h) in state or (g, "CPU", h) in state for h in ints])
    return longest_hit(len(prompt), engine.groups, cached)


def workload(seed: int, n: int) -> list[tuple[list[int], str | None, str | None]]:
    rng = random.Random(seed)
    prefixes = [[rng.randrange(50_000) for _ in range(rng.randrange(4, 40))] for _ in range(6)]
    out = []
    for _ in range(n):
        prompt = list(rng.choice(prefixes))
        prompt += [rng.randrange(50_000) for _ in range(rng.randrange(0, 24))]
        if rng.random() < 0.3:  # grow a prefix: multi-turn sessions
            prefixes[rng.randrange(len(prefixes))] = prompt
        salt = rng.choice([None, None, None, "tenant-a"])
        lora = rng.choice([None, None, None, "sql"])
        out.append((prompt, salt, lora))
    return out


@pytest.mark.parametrize(
    ("groups", "policy"),
    [
        ("full:4", "lru"),
        ("full:4,swa:4:8,mamba:4", "lru"),
        ("full:4,swa:8:16", "arc"),
        ("full:4,swa:4:4,mamba:8", "arc"),
    ],
)
def test_replayed_events_match_engine_state_after_every_request(groups: str, policy: str) -> None:
    capture = WireCapture()
    cfg = EngineConfig(groups=groups, gpu_blocks=40, cpu_blocks=24, cpu_policy=policy)
    engine = SimEngine(cfg, capture)
    state: State = Counter()
    seen = 0

    rehasher = Rehasher(engine.kv.hash_block_size)

    def catch_up() -> None:
        nonlocal seen
        for payload in capture.payloads[seen:]:
            batch = decode_batch(payload)
            apply(state, batch)
            rehasher.check(batch)
        seen = len(capture.payloads)

    for i, (prompt, salt, lora) in enumerate(workload(sum(map(ord, groups)), 150)):
        if i == 90:
            assert engine.reset_prefix_cache()
            catch_up()
            assert set(state) == engine.state() == set()
        predicted = hit_from_state(engine, state, prompt, salt, lora)
        try:
            result = engine.serve(prompt, salt, lora)
        except RequestTooLargeError:
            catch_up()  # a prompt refused mid-prefill may have cached its first chunks
            assert set(state) == engine.state(), f"request {i}"
            continue
        if not engine.kv.partial_hits:
            assert result.cached_tokens == predicted, f"request {i}"
        catch_up()
        assert set(state) == engine.state(), f"request {i}"
    s = engine.stats
    assert s.offloaded_blocks > 0 and s.loaded_blocks > 0 and engine.kv.pool.evictions > 0
    assert s.load_verify_failures == 0
    assert s.resets == 1
    assert rehasher.verified["GPU"] > 0 and rehasher.verified["CPU"] > 0
    assert any(m == "CPU" for _, m, _ in state) and any(m == "GPU" for _, m, _ in state)


def test_events_received_on_a_real_sub_socket_rebuild_the_state() -> None:
    pub = ZmqEventPublisher("tcp://127.0.0.1:*", replay_endpoint="tcp://127.0.0.1:*", topic="kv@w1")
    ctx = zmq.Context.instance()
    sub = ctx.socket(zmq.SUB)
    dealer = ctx.socket(zmq.DEALER)
    try:
        assert pub.bound_endpoint and pub.bound_replay_endpoint
        sub.setsockopt(zmq.SUBSCRIBE, b"kv@w1")
        sub.connect(pub.bound_endpoint)
        dealer.connect(pub.bound_replay_endpoint)
        cfg = EngineConfig(groups="full:4,swa:4:8", gpu_blocks=48, cpu_blocks=16)
        engine = SimEngine(cfg, pub)
        for prompt, salt, lora in workload(7, 80):
            with contextlib.suppress(RequestTooLargeError):
                engine.serve(prompt, salt, lora)
        total = engine.stats.batches
        payloads: dict[int, bytes] = {}
        deadline = time.monotonic() + 20
        # Live frames; a subscriber joining late misses the first ones (ZMQ slow joiner).
        while time.monotonic() < deadline and (total - 1) not in payloads:
            if sub.poll(200):
                topic, seq, payload = sub.recv_multipart()
                assert topic == b"kv@w1"
                payloads[int.from_bytes(seq, "big")] = payload
        assert payloads, "no live frame arrived"
        missing = [s for s in range(total) if s not in payloads]
        if missing:  # fetch what was missed from the replay socket, like a router
            dealer.send_multipart([b"", missing[0].to_bytes(8, "big")])
            while True:
                assert dealer.poll(10_000), "replay timed out"
                _, topic, seq, payload = dealer.recv_multipart()
                if topic == b"":
                    break
                payloads.setdefault(int.from_bytes(seq, "big"), payload)
        assert sorted(payloads) == list(range(total))
        state: State = Counter()
        for seq in range(total):
            apply(state, decode_batch(payloads[seq]))
        assert set(state) == engine.state()
        assert engine.stats.offloaded_blocks > 0
    finally:
        sub.close(linger=0)
        dealer.close(linger=0)
        pub.shutdown()
