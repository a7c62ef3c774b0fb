"""The router's estimate equals what our engine actually reuses.

A real ``SimEngine`` (GPU block pool, hybrid groups, CPU tier with torch buffers) serves a
random workload of shared-prefix prompts; its events feed the ingestor through the wire
encoder and decoder. Before every request the scorer predicts ``hit_tokens`` and
``hit_tokens_gpu``; the engine then reports ``cached_tokens`` and ``gpu_cached_tokens``.
They must be equal, request after request, on both backends.
"""

from __future__ import annotations

import random

import pytest
from _kv_streams import Harness, new_index, wire

from offload_core.engine import EngineConfig, SimEngine
from publisher import NullEventPublisher
from schemas import KVEventBatch


class _Collect(NullEventPublisher):
    def __init__(self) -> None:
        self.batches: list[KVEventBatch] = []

    def publish(self, batch: KVEventBatch) -> None:
        self.batches.append(batch)


def _prompts(rng: random.Random) -> list[list[int]]:
    system = [rng.randrange(1, 30_000) for _ in range(40)]
    docs = [[rng.randrange(1, 30_000) for _ in range(rng.randint(20, 90))] for _ in range(6)]
    return [
        system + d + [rng.randrange(1, 30_000) for _ in range(rng.randint(1, 40))] for d in docs
    ]


@pytest.mark.parametrize(
    ("kind", "groups", "gpu", "cpu", "seed"),
    [
        ("memory", "full:16,swa:16:48", 40, 48, 1),
        ("memory", "full:16,mamba:16", 36, 0, 2),
        ("memory", "full:16,swa:8:24", 44, 64, 3),
        ("redis", "full:16,swa:16:48", 40, 48, 4),
    ],
)
async def test_router_estimate_equals_engine_hit(
    kind: str, groups: str, gpu: int, cpu: int, seed: int, request: pytest.FixtureRequest
) -> None:
    url = request.getfixturevalue("redis_url") if kind == "redis" else None
    out = _Collect()
    engine = SimEngine(
        EngineConfig(worker_id="e", groups=groups, gpu_blocks=gpu, cpu_blocks=cpu), out
    )
    h = Harness.build(new_index(kind, url))
    rng = random.Random(seed)
    prompts = _prompts(rng)
    checked = offloaded_hits = 0
    try:
        for step in range(60):
            base = rng.choice(prompts)
            toks = base[: rng.randint(len(base) // 2, len(base))]
            salt = "tenant" if rng.random() < 0.15 else None
            predicted = (await h.score(toks, ["e"], cache_salt=salt)).workers[0]
            got = engine.serve(toks, cache_salt=salt)
            assert (predicted.hit_tokens, predicted.hit_tokens_gpu) == (
                got.cached_tokens,
                got.gpu_cached_tokens,
            ), f"step {step}"
            checked += got.cached_tokens > 0
            offloaded_hits += got.cached_tokens > got.gpu_cached_tokens
            for batch in out.batches:
                await h.ingestor.apply_batch("e", wire(*batch.events))
            out.batches.clear()
        c = h.ingestor.counters
        assert (c.unknown_parent, c.unresolved_blocks, c.bad_events) == (0, 0, 0)
        assert checked > 10
        if cpu:
            assert offloaded_hits > 0
    finally:
        engine.shutdown()
        await h.index.close()


async def test_hybrid_with_offload_and_decode_stays_exact() -> None:
    """The demo's fleet shape (full 64 + sliding window 16, CPU tier) under the demo's
    synthetic workload with decode: offloaded sliding-window blocks and decode-time stores
    chain from units no event names; the router finds them by their tokens."""
    from router.bench.workloads import SyntheticConfig, synthetic_workload

    out = _Collect()
    engine = SimEngine(
        EngineConfig(worker_id="e", groups="full:64,swa:16:32", gpu_blocks=768, cpu_blocks=256),
        out,
    )
    h = Harness.build(new_index("memory", None))
    wrong = []
    try:
        for i, req in enumerate(synthetic_workload(SyntheticConfig(requests=300, seed=0))):
            toks = list(req.token_ids)
            predicted = (await h.score(toks, ["e"])).workers[0]
            got = engine.serve(toks, max_tokens=min(req.output_tokens, 16))
            if predicted.hit_tokens != got.cached_tokens:
                wrong.append((i, predicted.hit_tokens, got.cached_tokens))
            for batch in out.batches:
                await h.ingestor.apply_batch("e", wire(*batch.events))
            out.batches.clear()
        assert wrong == []
        c = h.ingestor.counters
        assert (c.unknown_parent, c.unresolved_blocks, c.bad_events) == (0, 0, 0)
    finally:
        engine.shutdown()
        await h.index.close()
