"""Routing policies: pure functions of (request, per-worker views) -> chosen worker.

No I/O, no clocks: the REST API and the trace simulation feed the same inputs (the
scorer's per-worker estimates, the router's in-flight accounting, predicted entries)
and get the same decisions. State a policy needs between calls (round-robin position)
lives in the policy object; randomness comes from an injected, seedable ``random.Random``.

The default ``kv_aware`` cost of sending a request to worker ``w``, in prompt tokens of
prefill work::

    affinity_w = max(score_w, predicted_w)        # tier-weighted cached tokens
    affinity_w = hot-prefix discount(affinity_w)  # see ``discount_hot``
    cost_w = prefill * (request_tokens - affinity_w)
           + backlog * prefill_backlog_w          # uncached tokens not prefilled yet
           + decode * inflight_w                  # decode slots, in token equivalents

plus a balance guard: a worker whose load exceeds the fleet's mean by more than
``balance_slack`` loses its cache affinity, so a popular prefix cannot pile traffic onto
one worker once that worker is clearly busier than the rest.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field

DEFAULT_POLICY = "kv_aware"


@dataclass(frozen=True, slots=True)
class PolicyWeights:
    """Weights of the ``kv_aware`` cost, in prompt-token units.

    Defaults were tuned with ``kvroute bench routing`` on the Mooncake conversation trace
    (8 workers, 1024 blocks of 512 tokens each;
    docs/benchmarks.md#routing-on-the-mooncake-trace) and checked over
    several tie-break seeds: a backlog token weighs 0.15 of a token this request must
    prefill (work saved is saved for good, queueing behind a backlog is brief), and each
    in-flight request 512 tokens (steady pressure that keeps totals balanced).
    """

    prefill: float = 1.0
    backlog: float = 0.15
    decode: float = 512.0
    # Hits on a prefix that at least ``hot_fraction`` of recent requests share count
    # ``hot_discount`` times: every worker will hold such a prefix soon, so it should not
    # decide placement.
    hot_fraction: float = 0.5
    hot_discount: float = 0.0
    # A worker whose load is above ``(1 + balance_slack) * mean + balance_floor`` loses
    # its affinity: balance wins over cache reuse there. Loose by default (a safety net
    # against runaway hot spots; it never fires on the Mooncake trace).
    balance_slack: float = 0.5
    balance_floor: float = 65_536.0
    # Decode tokens the router assumes per request when the caller does not say.
    expected_output_tokens: int = 256


@dataclass(frozen=True, slots=True)
class WorkerView:
    """Everything a policy may look at for one worker."""

    worker_id: str
    hit_tokens: int = 0
    hit_tokens_gpu: int = 0
    score: float = 0.0
    predicted_tokens: int = 0
    inflight: int = 0
    prefill_backlog: float = 0.0
    inflight_decode: float = 0.0


@dataclass(frozen=True, slots=True)
class RouteInput:
    request_tokens: int
    hot_tokens: int = 0


@dataclass(frozen=True, slots=True)
class Choice:
    index: int
    loads: list[float] = field(default_factory=list)
    costs: list[float] = field(default_factory=list)


def worker_load(view: WorkerView, weights: PolicyWeights) -> float:
    """Outstanding work on a worker, in prompt-token equivalents."""
    return weights.backlog * view.prefill_backlog + weights.decode * view.inflight


def discount_hot(affinity: float, hot_tokens: int, discount: float) -> float:
    """Count hits inside the hot prefix ``discount`` times, the rest in full."""
    if hot_tokens <= 0 or discount >= 1.0:
        return affinity
    hot = min(affinity, float(hot_tokens))
    return (affinity - hot) + discount * hot


def pick_min(values: Sequence[float], rng: random.Random, tolerance: float = 1e-9) -> int:
    """Index of the smallest value; ties (within ``tolerance``) broken at random."""
    best = min(values)
    ties = [i for i, v in enumerate(values) if v <= best + tolerance]
    return ties[0] if len(ties) == 1 else rng.choice(ties)


class Policy:
    """Chooses one of ``views`` (never empty) for a request.

    Every policy reports the same per-worker loads; a policy says only how it costs a
    worker (:meth:`costs`) and, where it is not "cheapest wins", how it picks
    (:meth:`pick`).
    """

    name: str

    def choose(
        self,
        request: RouteInput,
        views: Sequence[WorkerView],
        weights: PolicyWeights,
        rng: random.Random,
    ) -> Choice:
        loads = [worker_load(v, weights) for v in views]
        costs = self.costs(request, views, loads, weights)
        return Choice(self.pick(views, costs, rng), loads, costs)

    def costs(
        self,
        request: RouteInput,
        views: Sequence[WorkerView],
        loads: list[float],
        weights: PolicyWeights,
    ) -> list[float]:
        """Cost of sending ``request`` to each worker; all zero for cost-blind policies."""
        return [0.0] * len(views)

    def pick(self, views: Sequence[WorkerView], costs: list[float], rng: random.Random) -> int:
        """Index of the chosen worker: the cheapest, ties broken at random."""
        return pick_min(costs, rng)


class RandomPolicy(Policy):
    name = "random"

    def pick(self, views: Sequence[WorkerView], costs: list[float], rng: random.Random) -> int:
        return rng.randrange(len(views))


class RoundRobinPolicy(Policy):
    """Cycles through workers in worker-id order (stable when the fleet changes)."""

    name = "round_robin"

    def __init__(self) -> None:
        self._last: str | None = None

    def pick(self, views: Sequence[WorkerView], costs: list[float], rng: random.Random) -> int:
        order = sorted(range(len(views)), key=lambda i: views[i].worker_id)
        nxt = order[0]
        if self._last is not None:
            for i in order:
                if views[i].worker_id > self._last:
                    nxt = i
                    break
        self._last = views[nxt].worker_id
        return nxt


class LeastLoadedPolicy(Policy):
    """The kv_aware load term alone: ignores caches entirely."""

    name = "least_loaded"

    def costs(
        self,
        request: RouteInput,
        views: Sequence[WorkerView],
        loads: list[float],
        weights: PolicyWeights,
    ) -> list[float]:
        return loads


class LongestPrefixPolicy(Policy):
    """The most cached tokens per the index; no load term (the classic prefix router)."""

    name = "longest_prefix"

    def costs(
        self,
        request: RouteInput,
        views: Sequence[WorkerView],
        loads: list[float],
        weights: PolicyWeights,
    ) -> list[float]:
        return [float(request.request_tokens - v.hit_tokens) for v in views]


class KvAwarePolicy(Policy):
    """Cache affinity against load; see the module docstring for the cost."""

    name = "kv_aware"

    def costs(
        self,
        request: RouteInput,
        views: Sequence[WorkerView],
        loads: list[float],
        weights: PolicyWeights,
    ) -> list[float]:
        mean = sum(loads) / len(loads)
        limit = (1.0 + weights.balance_slack) * mean + weights.balance_floor
        costs: list[float] = []
        for view, load in zip(views, loads, strict=True):
            affinity = 0.0
            if load <= limit:
                affinity = max(view.score, float(view.predicted_tokens))
                affinity = discount_hot(affinity, request.hot_tokens, weights.hot_discount)
            costs.append(weights.prefill * (request.request_tokens - affinity) + load)
        return costs


POLICY_CLASSES: dict[str, type[Policy]] = {
    cls.name: cls
    for cls in (
        KvAwarePolicy,
        RandomPolicy,
        RoundRobinPolicy,
        LeastLoadedPolicy,
        LongestPrefixPolicy,
    )
}
POLICY_NAMES: tuple[str, ...] = tuple(POLICY_CLASSES)


def make_policy(name: str) -> Policy:
    """A fresh policy object by name; ``ValueError`` for an unknown name."""
    try:
        return POLICY_CLASSES[name]()
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; expected one of {list(POLICY_NAMES)}") from None
