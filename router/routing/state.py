"""The router's routing state and the one entry point that turns scores into decisions.

* :class:`InflightTable` -- a request counts as load on its worker from dispatch until
  it is finished or its TTL passes (expired lazily, on every call, in deadline order).
* :class:`PrefixMemory` -- short-lived *predicted* entries (prefix -> chosen worker) so a
  burst of siblings sharing a new prefix lands together before the engine's events
  arrive, and a sliding window of recent prefixes to detect hot ones (system prompts).
* :class:`RoutingCore` -- scores + state -> :mod:`router.routing.policy` -> decision. The REST
  API and the trace simulation both drive this class; only the clock differs.
"""

from __future__ import annotations

import heapq
import random
import time
from collections import Counter, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

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
from router.routing.speed import SpeedEstimator


class DuplicateRequestError(KeyError):
    """A request id that is still in flight was dispatched again."""


@dataclass(slots=True)
class Inflight:
    request_id: str
    worker_id: str
    deadline: float
    prefill_tokens: float
    decode_tokens: float
    tokens: float = 0.0  # prompt tokens (blocks held while it runs)
    dispatched: float = 0.0


@dataclass(slots=True)
class WorkerLoad:
    """A worker's load as the router sees it. ``prefill_backlog`` is the uncached prompt
    tokens dispatched to it that it has not prefilled yet (a fluid estimate)."""

    requests: int = 0
    prefill_backlog: float = 0.0
    decode_tokens: float = 0.0
    updated: float = 0.0
    tokens: float = 0.0


# What the views say about an engine that reported nothing (frozen: one for all).
_UNKNOWN_ENGINE = EngineStats()
# What ``InflightTable.loads_for`` answers for a worker with nothing in flight.
_IDLE = WorkerLoad()


class InflightTable:
    """In-flight requests per worker, with a TTL so lost finishes cannot leak load.

    Prefill backlog: each dispatch adds its uncached tokens; with ``prefill_tps > 0`` the
    backlog drains at that rate (the router's estimate of a worker's prefill speed), so a
    request that is long past its prefill -- decoding -- stops counting as prefill work
    without the engine telling the router. With ``prefill_tps == 0`` it drains only when
    requests finish. The backlog is zero whenever nothing is in flight.
    """

    def __init__(self, ttl: float = 120.0, prefill_tps: float = 0.0) -> None:
        if ttl <= 0:
            raise ValueError("ttl must be positive")
        if prefill_tps < 0:
            raise ValueError("prefill_tps must be >= 0")
        self.ttl = ttl
        self.prefill_tps = prefill_tps
        self.expired = 0
        self._items: dict[str, Inflight] = {}
        # Per worker, requests whose prefill has not ended, in dispatch order (lazy).
        self._prefilling: dict[str, deque[Inflight]] = {}
        self._loads: dict[str, WorkerLoad] = {}
        self._deadlines: list[tuple[float, str]] = []

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._items

    def _drain(self, load: WorkerLoad, now: float) -> None:
        if self.prefill_tps > 0 and now > load.updated:
            done = (now - load.updated) * self.prefill_tps
            load.prefill_backlog = max(0.0, load.prefill_backlog - done)
            load.updated = now

    def add(
        self,
        request_id: str,
        worker_id: str,
        now: float,
        prefill_tokens: float = 0.0,
        decode_tokens: float = 0.0,
        tokens: float = 0.0,
    ) -> Inflight:
        if request_id in self._items:
            raise DuplicateRequestError(request_id)
        item = Inflight(
            request_id, worker_id, now + self.ttl, prefill_tokens, decode_tokens, tokens, now
        )
        self._items[request_id] = item
        load = self._loads.get(worker_id)
        if load is None:
            load = self._loads[worker_id] = WorkerLoad(updated=now)
        self._drain(load, now)
        load.requests += 1
        load.prefill_backlog += prefill_tokens
        if prefill_tokens > 0:
            self._prefilling.setdefault(worker_id, deque()).append(item)
        load.decode_tokens += decode_tokens
        load.tokens += tokens
        heapq.heappush(self._deadlines, (item.deadline, request_id))
        return item

    def finish(self, request_id: str) -> Inflight | None:
        """Remove a request; None when it is unknown (never dispatched, or expired)."""
        item = self._items.pop(request_id, None)
        if item is None:
            return None
        load = self._loads[item.worker_id]
        load.requests -= 1
        if load.requests == 0:
            del self._loads[item.worker_id]  # also resets float drift
            return item
        load.decode_tokens -= item.decode_tokens
        load.tokens -= item.tokens
        if self.prefill_tps == 0:
            load.prefill_backlog -= item.prefill_tokens
        return item

    def get(self, request_id: str) -> Inflight | None:
        return self._items.get(request_id)

    def first_token(self, request_id: str) -> Inflight | None:
        """Prefill is over (the engine streamed a token): the request's uncached tokens
        leave its worker's backlog now rather than when it finishes."""
        item = self._items.get(request_id)
        if item is None or item.prefill_tokens == 0:
            return item
        load = self._loads[item.worker_id]
        load.prefill_backlog = max(0.0, load.prefill_backlog - item.prefill_tokens)
        item.prefill_tokens = 0.0
        return item

    def prefill_head(self, worker_id: str) -> Inflight | None:
        """The oldest request still in prefill on ``worker_id`` (engines admit FCFS, so it
        is the one being prefilled now), or None."""
        queue = self._prefilling.get(worker_id)
        while queue:
            item = queue[0]
            if item.prefill_tokens > 0 and self._items.get(item.request_id) is item:
                return item
            queue.popleft()
        return None

    def expire(self, now: float) -> int:
        """Drop every request whose deadline has passed; returns how many."""
        n = 0
        while self._deadlines and self._deadlines[0][0] <= now:
            deadline, request_id = heapq.heappop(self._deadlines)
            item = self._items.get(request_id)
            if item is not None and item.deadline == deadline:
                self.finish(request_id)
                n += 1
        self.expired += n
        return n

    def load(self, worker_id: str, now: float | None = None) -> WorkerLoad:
        """A snapshot of the worker's load (backlog drained up to ``now`` when given)."""
        load = self._loads.get(worker_id)
        if load is None:
            return WorkerLoad()
        if now is not None:
            self._drain(load, now)
        return WorkerLoad(
            load.requests, load.prefill_backlog, load.decode_tokens, load.updated, load.tokens
        )

    def loads_for(self, worker_ids: Sequence[str], now: float) -> list[WorkerLoad]:
        """Each worker's live load record, drained up to ``now`` -- one shared all-zero
        record for idle workers (most of a large fleet). Read them, never mutate them:
        unlike :meth:`load` these are not copies (one per worker per request was the
        routing path's largest allocation)."""
        loads = self._loads
        idle = _IDLE
        drain = self.prefill_tps > 0
        out: list[WorkerLoad] = []
        for w in worker_ids:
            load = loads.get(w)
            if load is None:
                out.append(idle)
                continue
            if drain:
                self._drain(load, now)
            out.append(load)
        return out

    def requests_by_worker(self) -> dict[str, int]:
        return {w: load.requests for w, load in self._loads.items()}


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
    default_policy: str = DEFAULT_POLICY
    inflight_ttl_s: float = 120.0
    # The router's estimate of one worker's prefill speed (tokens/s); 0 = no draining.
    prefill_tps: float = 16_000.0
    predict_ttl_s: float = 3.0
    prefix_block_tokens: int = 64
    hot_window: int = 256
    hot_min_requests: int = 16
    seed: int | None = None


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


class RoutingCore:
    """Scores in, a decision out; keeps in-flight load and prefix memory between calls."""

    def __init__(
        self,
        config: RoutingConfig | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config or RoutingConfig()
        make_policy(self.config.default_policy)  # validate early
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
        self._policies: dict[str, Policy] = {}
        # Prompt tokens routed per worker, decayed per routed request (the share term).
        self.recent: dict[str, float] = {}
        # Plain counters; the API exports them as Prometheus metrics at scrape time.
        self.routed: Counter[str] = Counter()
        self.routed_total = 0
        self.finished = 0

    def policy(self, name: str | None) -> Policy:
        """The (stateful) policy object for ``name``; ``ValueError`` when unknown."""
        name = name or self.config.default_policy
        if name not in self._policies:
            self._policies[name] = make_policy(name)
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
    ) -> Decision:
        """Choose a worker among ``scores`` (non-empty) and count the request on it
        (``engines``: what the engines last reported about themselves, where known)."""
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
                )
            )
        request = RouteInput(n, hot, self.config.prefix_block_tokens, self.routed_total)
        choice = chooser.choose(request, views, weights, self.rng)
        chosen = views[choice.index]
        expected = max(chosen.hit_tokens, chosen.predicted_tokens)
        out_tokens = weights.expected_output_tokens if decode_tokens is None else decode_tokens
        self.inflight.add(
            request_id, chosen.worker_id, now, float(n - expected), out_tokens, float(n)
        )
        self._count_recent(chosen.worker_id, n, len(views))
        if keys:
            self.memory.remember(keys, chosen.worker_id, now)
            self.memory.observe(keys)
        self.routed[chooser.name] += 1
        self.routed_total += 1
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
        )

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

    def first_token(self, request_id: str, now: float | None = None) -> bool:
        """The engine streamed the request's first token: its prefill leaves the backlog
        and the worker's speed estimate learns from it. False when it is unknown."""
        now = self.clock() if now is None else now
        item = self.inflight.get(request_id)
        if item is None:
            return False
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

    def inflight_by_worker(self) -> dict[str, int]:
        return self.inflight.requests_by_worker()
