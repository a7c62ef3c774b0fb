"""The router's routing state and the one entry point that turns scores into decisions.

* :class:`InflightTable` (:mod:`router.routing.inflight`, re-exported) -- a request
  counts as load on its worker from dispatch until it is finished or its TTL passes.
* :class:`PrefixMemory` -- short-lived *predicted* entries (prefix -> chosen worker) so a
  burst of siblings sharing a new prefix lands together before the engine's events
  arrive, and a sliding window of recent prefixes to detect hot ones (system prompts).
* :class:`RoutingCore` -- scores + state -> :mod:`router.routing.policy` -> decision. The REST
  API and the trace simulation both drive this class; only the clock differs.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from router.routing.base import prefill_chunk, share_weight, warm_prefixes
from router.routing.inflight import DuplicateRequestError, Inflight, InflightTable, WorkerLoad
from router.routing.policy import (
    DEFAULT_POLICY,
    EngineStats,
    Policy,
    PolicyWeights,
    RouteInput,
    WorkerView,
    make_policy,
)
from router.routing.prefix_memory import PrefixMemory
from router.routing.pressure import CachePressure
from router.routing.speed import SpeedEstimator

__all__ = [
    "Decision",
    "DuplicateRequestError",
    "Inflight",
    "InflightTable",
    "PrefixMemory",
    "RoutingConfig",
    "RoutingCore",
    "ScoreLike",
    "WorkerLoad",
]

# What the views say about an engine that reported nothing (frozen: one for all).
_UNKNOWN_ENGINE = EngineStats()


class ScoreLike(Protocol):
    """What the core needs from a scorer's per-worker answer (``schemas.rest.WorkerScore``)."""

    @property
    def worker_id(self) -> str: ...
    @property
    def hit_tokens(self) -> int: ...
    @property
    def hit_tokens_gpu(self) -> int: ...
    @property
    def score(self) -> float: ...


@dataclass(frozen=True, slots=True)
class RoutingConfig:
    weights: PolicyWeights = field(default_factory=PolicyWeights)
    # The route profile the weights started from (router.routing.profiles; reported only).
    profile: str = "default"
    default_policy: str = DEFAULT_POLICY
    inflight_ttl_s: float = 120.0
    # The router's estimate of one worker's prefill speed (tokens/s); 0 = no draining.
    prefill_tps: float = 16_000.0
    predict_ttl_s: float = 3.0
    prefix_block_tokens: int = 64
    hot_window: int = 256
    hot_min_requests: int = 16
    seed: int | None = None
    # Per policy name, the settings its objects are made with (``make_policy``): an
    # anchor as the user deploys it (``kvroute bench routing --policy-setting``).
    policy_settings: Mapping[str, Mapping[str, float]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Decision:
    request_id: str
    worker_id: str
    policy: str
    request_tokens: int
    hit_tokens: int
    hit_tokens_gpu: int
    predicted_tokens: int
    hot_tokens: int
    views: list[WorkerView]
    loads: list[float]
    costs: list[float]
    # Prompt lengths of the prefix-warming requests to send to the worker first, in
    # order (``PolicyWeights.warm_chunk``; empty: send the request as it is).
    warm: tuple[int, ...] = ()


class RoutingCore:
    """Scores in, a decision out; keeps in-flight load and prefix memory between calls."""

    def __init__(
        self,
        config: RoutingConfig | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config or RoutingConfig()
        make_policy(self.config.default_policy)  # validate early
        for name, values in self.config.policy_settings.items():
            make_policy(name, values)
        self.clock = clock
        self.rng = random.Random(self.config.seed)
        self.inflight = InflightTable(self.config.inflight_ttl_s, self.config.prefill_tps)
        self.speeds = SpeedEstimator(self.config.prefill_tps or 16_000.0)
        self.memory = PrefixMemory(
            self.config.prefix_block_tokens,
            self.config.predict_ttl_s,
            self.config.hot_window,
            self.config.hot_min_requests,
        )
        self.pressure = CachePressure()
        # Mean share of idle workers over recent requests (``PolicyWeights.fresh_idle`` and
        # ``warm_idle``; kept only where one of them is in use).
        self.idle = 1.0
        self._first_tokens_reported = False
        self._policies: dict[str, Policy] = {}
        # Prompt tokens routed per worker, decayed per routed request (the share term).
        self.recent: dict[str, float] = {}
        # Workers whose caches were reset since the last routed request (caches_cleared).
        self._cleared: set[str] = set()
        # Plain counters; the API exports them as Prometheus metrics at scrape time.
        self.routed: Counter[str] = Counter()
        # Requests routed since start or the last fleet-wide cache reset: the share
        # prior's warm-up (not exported; ``routed`` is the metric).
        self.routed_total = 0
        self.finished = 0

    def policy(self, name: str | None) -> Policy:
        """The (stateful) policy object for ``name``; ``ValueError`` when unknown."""
        name = name or self.config.default_policy
        if name not in self._policies:
            self._policies[name] = make_policy(name, self.config.policy_settings.get(name))
        return self._policies[name]

    def expire(self, now: float | None = None) -> int:
        now = self.clock() if now is None else now
        self.memory.expire(now)
        return self.inflight.expire(now)

    def route(
        self,
        request_id: str,
        token_ids: Sequence[int],
        scores: Sequence[ScoreLike],
        *,
        policy: str | None = None,
        decode_tokens: int | None = None,
        now: float | None = None,
        engines: Mapping[str, EngineStats] | None = None,
        expires: bool = True,
    ) -> Decision:
        """Choose a worker among ``scores`` (non-empty) and count the request on it
        (``engines``: what the engines last reported about themselves, where known;
        ``expires=False``: the caller always finishes it, so no TTL applies)."""
        if not scores:
            raise ValueError("no workers to route to")
        chooser = self.policy(policy)
        now = self.clock() if now is None else now
        self.expire(now)
        if request_id in self.inflight:
            raise DuplicateRequestError(request_id)
        weights = self.config.weights
        n = len(token_ids)
        # Prefix keys only feed kv_aware (predictions, hot prefixes): skip them otherwise.
        keys = self.memory.keys(token_ids) if chooser.name == DEFAULT_POLICY else []
        predicted = self.memory.predicted(keys, now) if keys else {}
        hot = self.memory.hot_tokens(keys, weights.hot_fraction) if keys else 0
        cap = max(n - 1, 0)
        unknown = _UNKNOWN_ENGINE
        ids = [s.worker_id for s in scores]
        speeds = self.speeds.relative(ids)
        loads = self.inflight.loads_for(ids, now)
        # Head progress is 0 unless enabled and the backlog leaves at first tokens.
        progress = self._head_progress if self._head_progress_on() else None
        capped = prefill_chunk(weights) > 0
        prefilling = self.inflight.prefilling_tokens
        recent = self.recent
        views = []
        # Positional arguments, in WorkerView's field order: 64 views a request at 64
        # workers, and keywords cost more than the fields' work.
        for s, load in zip(scores, loads, strict=True):
            w = s.worker_id
            backlog = load.prefill_backlog
            if progress is not None:
                backlog -= progress(w, now)
            p = predicted.get(w, 0) if predicted else 0
            views.append(
                WorkerView(
                    w,
                    s.hit_tokens,
                    s.hit_tokens_gpu,
                    float(s.score),
                    p if p < cap else cap,
                    load.requests,
                    backlog,
                    load.decode_tokens,
                    load.tokens,
                    speeds[w],
                    recent.get(w, 0.0),
                    engines.get(w, unknown) if engines else unknown,
                    prefilling(w) if capped and load.requests else (),
                )
            )
        gated = weights.share_roomy != 1.0 or weights.share_evicting != 1.0
        if gated:
            self._learn_pressure(keys, scores, views, n)
        pressure, evicting = self._pressure_gates() if gated else (1.0, 0.0)
        if weights.backlog_fresh > 0 or weights.warm_chunk > 0:
            now_idle = sum([1 for v in views if v.prefill_backlog <= 0]) / len(views)
            self.idle += (now_idle - self.idle) / max(16.0 * len(views), 1.0)
        request = RouteInput(
            n,
            hot,
            self.config.prefix_block_tokens,
            self.routed_total,
            pressure,
            evicting,
            self.idle,
        )
        choice = chooser.choose(request, views, weights, self.rng)
        chosen = views[choice.index]
        expected = max(chosen.hit_tokens, chosen.predicted_tokens)
        out_tokens = weights.expected_output_tokens if decode_tokens is None else decode_tokens
        self.inflight.add(
            request_id, chosen.worker_id, now, float(n - expected), out_tokens, float(n), expires
        )
        self._count_recent(chosen.worker_id, n, len(views))
        if keys:
            self.memory.remember(keys, chosen.worker_id, now)
            self.memory.observe(keys)
            if gated:  # only the pressure gate reads it back
                self.pressure.remember(keys, request_id, chosen.worker_id)
        self.routed[chooser.name] += 1
        self.routed_total += 1
        if self._cleared:
            self._cleared.clear()
        return Decision(
            request_id=request_id,
            worker_id=chosen.worker_id,
            policy=chooser.name,
            request_tokens=n,
            hit_tokens=chosen.hit_tokens,
            hit_tokens_gpu=chosen.hit_tokens_gpu,
            predicted_tokens=chosen.predicted_tokens,
            hot_tokens=hot,
            views=views,
            loads=choice.loads,
            costs=choice.costs,
            warm=self._warm(chooser.name, n, expected),
        )

    def _warm(self, policy: str, n: int, expected: int) -> tuple[int, ...]:
        """Prefill shaping (``PolicyWeights.warm_chunk``): kvroute's own policy only --
        the anchors re-implement routers that send each request as it is."""
        weights = self.config.weights
        chunk = weights.warm_chunk
        if chunk <= 0 or policy != DEFAULT_POLICY or self.idle < weights.warm_idle:
            return ()
        if expected > weights.warm_cached * n:
            return ()
        return warm_prefixes(n, expected, int(chunk))

    def _learn_pressure(
        self, keys: Sequence[int], scores: Sequence[ScoreLike], views: list[WorkerView], n: int
    ) -> None:
        """Learn from this request before routing it: whether it continues an earlier one
        (``CachePressure.continued``), and how much prefill work waits on the fleet's
        workers in units of its size."""
        pressure = self.pressure
        if keys:

            def hit_on(worker_id: str) -> int | None:
                for s in scores:
                    if s.worker_id == worker_id:
                        return s.hit_tokens
                return None

            key_tokens = self.config.prefix_block_tokens
            pressure.continued(keys, key_tokens, hit_on, self._prefilling)
        pressure.queued(sum([v.prefill_backlog for v in views]) / len(views), n)

    def _pressure_gates(self) -> tuple[float, float]:
        """The share term's two gates now, each 0..1 (``RouteInput.pressure`` and
        ``RouteInput.evicting``)."""
        w, pressure = self.config.weights, self.pressure
        return (
            pressure.gate(w.pressure_knee, w.queue_knee),
            pressure.evicting(w.pressure_knee, w.queue_knee),
        )

    def share_weight(self) -> float:
        """How many times its full weight the fair-share term weighs now (the policy's
        ``roomy`` factor; ``/metrics``): ``share_roomy`` in a fleet that neither loses hits
        nor queues, 1 under either, up to ``share_evicting`` where caches evict and
        nothing queues."""
        return share_weight(self.config.weights, *self._pressure_gates())

    def _prefilling(self, request_id: str) -> bool:
        """Whether a request may not have stored its prompt yet: in flight with no first
        token reported. Where first tokens are not reported at all (the proxy) a request
        counts as prefilled: its client sends the next turn only after reading the whole
        answer, a moment before the proxy finishes it."""
        if not self._first_tokens_reported:
            return False
        item = self.inflight.get(request_id)
        return item is not None and item.prefill_tokens > 0

    def observe_cached(self, hit_tokens: int, cached_tokens: int) -> None:
        """The engine reported ``cached_tokens`` for a request routed with ``hit_tokens``
        cached per the index: a cache-pressure sample (the share term's weight)."""
        self.pressure.reported(hit_tokens, cached_tokens)

    def _head_progress(self, worker_id: str, now: float) -> float:
        """Tokens of the request now in prefill on the worker that are already done: it
        started at its dispatch or at the worker's previous first token, whichever came
        later, and has run at the worker's learned speed since (capped at its size). Only
        where the backlog leaves at first tokens (``prefill_tps`` 0): a long prompt that
        is nearly prefilled no longer counts in full, so a session does not leave its
        cache to dodge a wait that is almost over."""
        if not self._head_progress_on():
            return 0.0
        share = self.config.weights.head_progress
        head = self.inflight.prefill_head(worker_id)
        if head is None:
            return 0.0
        start = max(head.dispatched, self.speeds.last_first_token(worker_id))
        done = max(0.0, now - start) * self.speeds.tps(worker_id)
        return share * min(head.prefill_tokens, done)

    def _head_progress_on(self) -> bool:
        return self.config.weights.head_progress > 0 and self.config.prefill_tps <= 0

    def _count_recent(self, worker_id: str, tokens: int, workers: int) -> None:
        """Decay every worker's recent tokens by one routed request's step (a window of
        ``share_window`` requests per worker), then add this request's to its worker."""
        keep = 1.0 - 1.0 / max(self.config.weights.share_window * workers, 1.0)
        for w in self.recent:
            self.recent[w] *= keep
        self.recent[worker_id] = self.recent.get(worker_id, 0.0) + tokens

    def caches_cleared(self, worker_id: str, fleet: Iterable[str] | None = None) -> None:
        """The worker's engine reset its prefix cache (``AllBlocksCleared``). Its recent
        tokens go to 0, as for a newly added worker: what was routed there is no cached
        prefix any more, so a burst a cache-blind policy piled on it must not steer the
        next requests away from an engine that holds nothing. Once every worker in the
        window was cleared with nothing routed since the first of those clears (a
        fleet-wide reset), the share prior's warm-up restarts too: the fleet is as cold
        as a new router's. In-flight load, predictions and cache pressure stay. ``fleet``:
        the workers registered now (default: those in the window, which keeps workers
        removed since)."""
        if worker_id in self.recent:
            self.recent[worker_id] = 0.0
        self._cleared.add(worker_id)
        if self._cleared.issuperset(self.recent if fleet is None else fleet):
            self.routed_total = 0

    def first_token(self, request_id: str, now: float | None = None) -> bool:
        """The engine streamed the request's first token: its prefill leaves the backlog
        and the worker's speed estimate learns from it. False when it is unknown."""
        now = self.clock() if now is None else now
        item = self.inflight.get(request_id)
        if item is None:
            return False
        self._first_tokens_reported = True
        if item.prefill_tokens > 0:
            self.speeds.observe(item.worker_id, item.dispatched, now, item.prefill_tokens)
        self.inflight.first_token(request_id)
        return True

    def finish(self, request_id: str, now: float | None = None) -> bool:
        """Stop counting a request; False when it is unknown or already expired."""
        self.expire(now)
        if self.inflight.finish(request_id) is None:
            return False
        self.finished += 1
        return True

    def forget_worker(self, worker_id: str) -> None:
        """The worker was removed: its in-flight load, its share of recent tokens and its
        learned speed go, so one registered again under its id starts as a new one."""
        self.inflight.drop_worker(worker_id)
        self.recent.pop(worker_id, None)
        self._cleared.discard(worker_id)
        self.speeds.forget(worker_id)

    def inflight_by_worker(self) -> dict[str, int]:
        return self.inflight.requests_by_worker()
