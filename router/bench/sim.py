"""Trace replay in simulated time through the router's real read and write paths.

A :class:`Fleet` is N simulated engines (``offload_core.kv_cache.KVCacheManager``, the
engines' own cache model) whose events go straight into a real ``Ingestor`` over a
``MemoryIndex``; requests are scored by the real ``Scorer`` and placed by the real
``RoutingCore``. No sockets, no sleeping: the clock is the trace's arrival times.

Service model (what makes in-flight load meaningful): each worker prefills one request
at a time, ``uncached tokens / prefill_tps`` seconds, then decodes it for
``output_tokens * decode_s_per_token`` seconds concurrently with others; the router hears
``finish`` when decode ends. By default blocks are cached at admission and freed at once,
so cache contents depend on routing only (and compare with the bounds, which see no
residency); with ``hold_blocks`` a request keeps its blocks until it finishes, as in a
real engine -- sliding-window blocks that left the window are freed (and evicted) long
before the rest, which is what the HMA benchmark needs to show.

Several fleets (one per policy) run in lock step over one pass of the workload: a
request's tokens are expanded and engine-hashed once, then replayed into every fleet.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from offload_core.kv_cache import KVCacheManager, RequestPlan, RequestTooLargeError
from offload_core.kv_cache import Request as EngineRequest
from router.bench.workloads import Request
from router.index.memory import MemoryIndex
from router.ingest.ingestor import Ingestor
from router.routing.state import RoutingConfig, RoutingCore
from router.score.scorer import Scorer
from schemas import KVEvent, KVEventBatch
from schemas.hit_rule import GroupSpec, longest_hit, max_candidate

EventFilter = Callable[[list[KVEvent]], list[KVEvent]]


@dataclass(frozen=True, slots=True)
class CostModel:
    """Per-worker service speed of the simulated engines."""

    prefill_tps: float = 16_000.0
    decode_s_per_token: float = 0.02


@dataclass(slots=True)
class FleetStats:
    requests: int = 0
    rejected: int = 0
    prompt_tokens: int = 0
    hit_tokens: int = 0
    exact: int = 0
    abs_err: int = 0
    over: int = 0
    under: int = 0
    predicted_used: int = 0
    ttft: list[float] = field(default_factory=list)
    tokens_by_worker: list[int] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        n = max(self.requests - self.rejected, 1)  # estimates are checked on served ones
        per = self.tokens_by_worker
        mean = sum(per) / len(per) if per else 0.0
        ttft = sorted(self.ttft)

        def p(q: float) -> float:
            return ttft[min(len(ttft) - 1, int(q * len(ttft)))] if ttft else 0.0

        return {
            "requests": self.requests,
            "rejected": self.rejected,
            "hit_rate": round(self.hit_tokens / max(self.prompt_tokens, 1), 5),
            "prefill_tokens_saved": self.hit_tokens,
            "prompt_tokens": self.prompt_tokens,
            "imbalance": round(max(per) / mean, 4) if mean else 1.0,
            "estimate_exact": round(self.exact / n, 5),
            "estimate_mae_tokens": round(self.abs_err / n, 2),
            "estimate_over": self.over,
            "estimate_under": self.under,
            "predicted_used": self.predicted_used,
            "ttft_mean_s": round(sum(ttft) / len(ttft), 4) if ttft else 0.0,
            "ttft_p50_s": round(p(0.5), 4),
            "ttft_p90_s": round(p(0.9), 4),
            "ttft_p99_s": round(p(0.99), 4),
        }


class Fleet:
    """N engines, one index, one scorer, one routing core, one policy."""

    def __init__(
        self,
        policy: str,
        *,
        workers: int,
        gpu_blocks: int,
        groups: Sequence[GroupSpec],
        routing: RoutingConfig,
        cost: CostModel,
        hash_algo: str = "sha256",
        event_delay_s: float = 0.0,
        event_filter: EventFilter | None = None,
        truth_all_workers: bool = False,
        hold_blocks: bool = False,
    ) -> None:
        self.policy = policy
        self.worker_ids = [f"w{i}" for i in range(workers)]
        self.engines = [KVCacheManager(groups, gpu_blocks, hash_algo) for _ in range(workers)]
        self.index = MemoryIndex()
        self.ingestor = Ingestor(self.index)
        self.scorer = Scorer(self.index)
        self.core = RoutingCore(routing, clock=lambda: 0.0)  # time is always passed in
        self.cost = cost
        self.event_delay_s = event_delay_s
        self.event_filter = event_filter
        self.truth_all_workers = truth_all_workers
        # Hold a request's blocks until it finishes (as an engine does while decoding);
        # off: cache and free at admission, so only routing decides the cache contents.
        self.hold_blocks = hold_blocks
        self._held: dict[str, tuple[KVCacheManager, RequestPlan]] = {}
        self.stats = FleetStats(tokens_by_worker=[0] * workers)
        # Estimate error over every (request, worker) pair, not just the chosen one.
        self.all_pairs = 0
        self.all_exact = 0
        self.all_abs_err = 0
        self._finishes: list[tuple[float, str]] = []
        self._deliveries: list[tuple[float, int, int, list[KVEvent]]] = []
        self._seq = 0
        self._prefill_free = [0.0] * workers

    async def advance(self, now: float) -> None:
        """Apply everything due by ``now``: finished requests and delayed events."""
        while self._finishes and self._finishes[0][0] <= now:
            t, rid = heapq.heappop(self._finishes)
            self.core.finish(rid, now=t)
            held = self._held.pop(rid, None)
            if held is not None:
                held[0].finish(held[1])  # frees blocks; evictions surface at allocation
        while self._deliveries and self._deliveries[0][0] <= now:
            t, _, w, events = heapq.heappop(self._deliveries)
            await self._apply(w, events, t)

    async def drain(self) -> None:
        """Apply everything still pending (end of the workload)."""
        await self.advance(float("inf"))

    async def _apply(self, w: int, events: list[KVEvent], t: float) -> None:
        if self.event_filter is not None:
            events = self.event_filter(events)
        if events:
            await self.ingestor.apply_batch(self.worker_ids[w], KVEventBatch(ts=t, events=events))

    async def step(
        self, req: Request, prepared: EngineRequest, packed: Sequence[int] | None = None
    ) -> None:
        """Route ``req`` (engine hashes in ``prepared``; ``packed``: the same tokens as an
        int32 array, which the scorer hashes without a list conversion)."""
        now = req.arrival
        await self.advance(now)
        tokens = req.token_ids if packed is None else packed
        # Structs, not the pydantic model: the policy reads the same attributes.
        scores = await self.scorer.score_result(tokens, self.worker_ids)  # type: ignore[arg-type]
        decision = self.core.route(
            req.request_id, req.token_ids, scores.workers, policy=self.policy, now=now
        )
        w = self.worker_ids.index(decision.worker_id)
        kv = self.engines[w]
        s = self.stats
        if self.truth_all_workers:
            self._check_all(scores.workers, prepared)
        try:
            plan = kv.begin(prepared)
        except RequestTooLargeError:
            # Counted as a full miss, so that hit rates share one denominator with the
            # bounds (which see every prompt).
            s.rejected += 1
            s.requests += 1
            s.prompt_tokens += len(req.token_ids)
            self.core.finish(req.request_id, now=now)
            return
        kv.allocate(plan)
        kv.commit(plan)
        if self.hold_blocks:
            self._held[req.request_id] = (kv, plan)
        else:
            kv.finish(plan)
        truth = plan.hit.hit_tokens
        events = kv.pool.take_events()
        if self.event_delay_s > 0:
            self._seq += 1
            heapq.heappush(self._deliveries, (now + self.event_delay_s, self._seq, w, events))
        else:
            await self._apply(w, events, now)
        n = len(req.token_ids)
        est = decision.hit_tokens
        s.requests += 1
        s.prompt_tokens += n
        s.hit_tokens += truth
        s.tokens_by_worker[w] += n
        s.exact += est == truth
        s.abs_err += abs(est - truth)
        s.over += est > truth
        s.under += est < truth
        s.predicted_used += decision.predicted_tokens > decision.hit_tokens
        start = max(now, self._prefill_free[w])
        prefill_end = start + (n - truth) / self.cost.prefill_tps
        self._prefill_free[w] = prefill_end
        s.ttft.append(prefill_end - now)
        done = prefill_end + req.output_tokens * self.cost.decode_s_per_token
        heapq.heappush(self._finishes, (done, req.request_id))

    def _check_all(self, workers: Sequence[Any], prepared: EngineRequest) -> None:
        for ws in workers:
            kv = self.engines[self.worker_ids.index(ws.worker_id)]
            truth = kv.find_longest_cache_hit(prepared).hit_tokens
            self.all_pairs += 1
            self.all_exact += ws.hit_tokens == truth
            self.all_abs_err += abs(ws.hit_tokens - truth)

    def summary(self) -> dict[str, Any]:
        out = self.stats.summary()
        if self.truth_all_workers:
            n = max(self.all_pairs, 1)
            out["estimate_exact_all_workers"] = round(self.all_exact / n, 5)
            out["estimate_mae_all_workers"] = round(self.all_abs_err / n, 2)
        return out


class SharedCacheBound:
    """ONE engine cache of N*C blocks serving every request: the capacity-matched bound."""

    def __init__(self, groups: Sequence[GroupSpec], blocks: int, hash_algo: str) -> None:
        self.kv = KVCacheManager(groups, blocks, hash_algo, enable_events=False)
        self.prompt_tokens = 0
        self.hit_tokens = 0

    def step(self, prepared: EngineRequest) -> None:
        try:
            plan = self.kv.begin(prepared)
        except RequestTooLargeError:
            self.prompt_tokens += len(prepared.token_ids)
            return
        self.kv.allocate(plan)
        self.kv.commit(plan)
        self.kv.finish(plan)
        self.prompt_tokens += len(prepared.token_ids)
        self.hit_tokens += plan.hit.hit_tokens

    @property
    def hit_rate(self) -> float:
        return round(self.hit_tokens / max(self.prompt_tokens, 1), 5)


class InfiniteCacheBound:
    """Every full block ever computed stays cached: the hit rate no cache size can beat.

    With nothing evicted, every group holds every block of every earlier prompt, so the
    hit rule (docs/design.md#hit-rule) reduces to "the longest prefix of blocks seen before"
    (still aligned to the lcm and capped at ``request_tokens - 1`` by ``longest_hit``).
    """

    def __init__(self, groups: Sequence[GroupSpec]) -> None:
        self.groups = list(groups)
        self.seen: dict[int, set[bytes]] = {g.block_size: set() for g in self.groups}
        self.prompt_tokens = 0
        self.hit_tokens = 0

    def step(self, prepared: EngineRequest) -> None:
        n = len(prepared.token_ids)
        cached = []
        for g in self.groups:
            seen = self.seen[g.block_size]
            cached.append([d in seen for d in prepared.hashes[g.block_size]])
        hit = longest_hit(n, self.groups, cached) if max_candidate(n, 1) else 0
        self.prompt_tokens += n
        self.hit_tokens += hit
        for size, digests in prepared.hashes.items():
            self.seen[size].update(digests)

    @property
    def hit_rate(self) -> float:
        return round(self.hit_tokens / max(self.prompt_tokens, 1), 5)
