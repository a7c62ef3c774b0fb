"""Routing policies: pure functions of (request, per-worker views) -> chosen worker.

No I/O, no clocks: the REST API and the trace simulation feed the same inputs (the
scorer's per-worker estimates, the router's in-flight accounting, predicted entries)
and get the same decisions. State a policy needs between calls (round-robin position)
lives in the policy object; randomness comes from an injected, seedable ``random.Random``.

The default ``kv_aware`` cost of sending a request to worker ``w``, in prompt tokens of
prefill work::

    affinity_w = max(score_w, predicted_w)        # tier-weighted cached tokens
    affinity_w = hot-prefix discount(affinity_w)  # see ``discount_hot``
    cost_w = prefill * (request_tokens - affinity_w)   # (prefill_large for a large request)
           + backlog * prefill_backlog_w          # uncached tokens not prefilled yet
                                                  # (backlog_fresh for a large request
                                                  #  with nothing cached, fleet idle)
                                                  # (one chunk per prefill ahead where
                                                  #  engines cap prefills: prefill_cap)
           + decode * inflight_w                  # decode slots, in token equivalents
           + held * inflight_tokens_w             # KV held by running requests
                                                  # (held_large for a large request)
           + share * roomy * request_tokens * (recent_w - mean(recent))
                   / (mean(recent) + prior)  # fair share
    prior = share_prior * request_tokens, fading over the first share_warmup x N requests
    roomy = share_roomy + (1 - share_roomy) * pressure   # 1 under cache pressure
    roomy *= 1 + (share_evicting - 1) * evicting         # caches evict, work does not queue

plus a balance guard: a worker whose load exceeds the fleet's mean by more than
``balance_slack`` loses its cache affinity, so a popular prefix cannot pile traffic onto
one worker once that worker is clearly busier than the rest.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Mapping, Sequence

from router.routing.anchors import ANCHOR_CLASSES
from router.routing.base import (
    DEFAULT_POLICY,
    Choice,
    EngineStats,
    Policy,
    PolicyWeights,
    RouteInput,
    WorkerView,
    backlog_weight,
    discount_hot,
    held_weight,
    pick_min,
    prefill_chunk,
    prefill_weight,
    share_prior_tokens,
    share_weight,
    worker_load,
)

__all__ = [
    "COMPARED_POLICIES",
    "DEFAULT_POLICY",
    "POLICY_CLASSES",
    "POLICY_NAMES",
    "Choice",
    "EngineStats",
    "Policy",
    "PolicyWeights",
    "RouteInput",
    "WorkerView",
    "check_policy",
    "discount_hot",
    "make_policy",
    "parse_policy_settings",
    "pick_min",
    "policy_weights",
    "worker_load",
]


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
        n = request.request_tokens
        ctx = weights.context_tokens
        fair = sum([v.recent_tokens for v in views]) / len(views)
        prior = share_prior_tokens(request, len(views), weights)
        # The weights in locals and the hot discount only where there is a hot prefix:
        # this loop runs for every worker on every request (same arithmetic as the
        # module docstring's formula, term by term, so decisions do not move).
        hot = float(request.hot_tokens)
        discount = weights.hot_discount
        discounting = request.hot_tokens > 0 and discount < 1.0
        prefill, backlog_w, over, knee = (
            prefill_weight(n, weights),
            backlog_weight(request, views, weights),
            weights.backlog_over,
            weights.knee,
        )
        decode_w, held = weights.decode, held_weight(n, weights)
        sharing = weights.share > 0 and fair > 0
        share_n = weights.share * n * share_weight(weights, request.pressure, request.evicting)
        over_fair = fair + prior
        costs: list[float] = []
        append = costs.append
        # (``ttft_miss`` can apply only to a request of at least that many tokens: the
        # per-worker TTFT lists are not built for the others.)
        timed = (
            weights.ttft_below > 0
            or 0 < weights.ttft_miss <= n
            or weights.escape > 0
            or weights.escape_floor > 0
        )
        ttft_share = weights.ttft_share
        chunk = prefill_chunk(weights)
        ttfts: list[float] = []  # expected TTFT, in tokens at the nominal speed
        extras: list[float] = []  # the held and share terms
        best_hit = 0.0
        for view, load in zip(views, loads, strict=True):
            affinity = 0.0
            if load <= limit:
                affinity = view.score
                predicted = float(view.predicted_tokens)
                if predicted > affinity:
                    affinity = predicted
                if discounting:
                    in_hot = hot if hot < affinity else affinity
                    affinity = (affinity - in_hot) + discount * in_hot
            miss = n - affinity
            if ctx > 0:  # attention over the context: long prompts cost super-linearly
                miss *= 1.0 + (affinity + miss / 2) / ctx
            speed = view.speed if view.speed > 0 else 1.0
            waits = view.prefill_backlog
            if chunk > 0 and waits > 0:
                waits = _capped_wait(view, miss, chunk)
            queue = backlog_w * waits
            if over > 0:  # a backlog past the knee (a long prompt) repels
                queue += over * max(0.0, waits - knee)
            decode = decode_w * view.inflight + held * view.inflight_tokens
            shared = share_n * ((view.recent_tokens - fair) / over_fair) if sharing else 0.0
            append((prefill * miss + queue) / speed + (decode + shared))
            if timed:
                ttfts.append((miss + waits) / speed)
                extras.append(decode + ttft_share * shared)
                if affinity > best_hit:
                    best_hit = affinity
        if timed:
            return _timed(costs, ttfts, extras, best_hit, n, weights)
        return costs


def _capped_wait(view: WorkerView, miss: float, chunk: float) -> float:
    """The backlog a request that must prefill ``miss`` tokens waits behind where engines
    cap each prefill at ``chunk`` tokens a step: of each prefill ahead of it, what that
    one gets while this one runs (at most ``max(miss, chunk)``), never more than the
    backlog itself."""
    c = miss if miss > chunk else chunk
    waits = 0.0
    for r in view.prefilling:
        waits += r if r < c else c
    return waits if waits < view.prefill_backlog else view.prefill_backlog


def _timed(
    costs: list[float],
    ttfts: list[float],
    extras: list[float],
    best_hit: float,
    n: int,
    weights: PolicyWeights,
) -> list[float]:
    """Where time decides (see ``PolicyWeights``): a request with little cached anywhere
    is priced by its expected TTFT (plus the held and share terms); any other keeps its
    costs, but a worker where it would wait more than the escape threshold longer than on
    the fastest worker is ruled out (a cached turn behind a long prompt moves; a short
    queue is worth waiting in for a cache hit)."""
    if best_hit < weights.ttft_below * n or 0 < weights.ttft_miss <= n - best_hit:
        return [t + e for t, e in zip(ttfts, extras, strict=True)]
    if weights.escape > 0 or weights.escape_floor > 0:
        limit = min(ttfts) + weights.escape * n + weights.escape_floor
        return [c if t <= limit else c + _RULED_OUT for c, t in zip(costs, ttfts, strict=True)]
    return costs


# Added to the cost of a worker the escape rule rules out: above any real cost, finite so
# that ties among ruled-out workers still break by cost.
_RULED_OUT = 1e15


_ALL_POLICIES: tuple[type[Policy], ...] = (
    KvAwarePolicy,
    RandomPolicy,
    RoundRobinPolicy,
    LeastLoadedPolicy,
    LongestPrefixPolicy,
    *ANCHOR_CLASSES,
)
POLICY_CLASSES: dict[str, type[Policy]] = {cls.name: cls for cls in _ALL_POLICIES}
POLICY_NAMES: tuple[str, ...] = tuple(POLICY_CLASSES)


# What `kvroute demo` and `kvroute bench routing` compare unless told otherwise (random is
# available by name but only adds run time).
COMPARED_POLICIES = ("kv_aware", "round_robin", "least_loaded", "longest_prefix")


def check_policy(name: str) -> str:
    """``name`` if it names a policy, else ``ValueError`` listing them — the one check
    behind the config, the CLI, ``/v1/route`` and the proxy."""
    if name not in POLICY_CLASSES:
        raise ValueError(f"unknown policy {name!r}; expected one of {list(POLICY_NAMES)}")
    return name


def policy_weights(overrides: Mapping[str, object] | None = None) -> PolicyWeights:
    """``PolicyWeights`` with ``overrides`` applied (numbers, or strings holding one);
    ``ValueError`` naming an unknown or non-numeric weight."""
    fields = {f.name for f in dataclasses.fields(PolicyWeights)}
    overrides = dict(overrides or {})
    unknown = sorted(set(overrides) - fields)
    if unknown:
        raise ValueError(f"unknown route weight(s) {unknown}; expected some of {sorted(fields)}")
    values: dict[str, float | int] = {}
    for name, raw in overrides.items():
        try:
            number = float(raw)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            raise ValueError(f"route weight {name}={raw!r} is not a number") from None
        # Every weight is a price, a size or a share: NaN made every request a 500 (no
        # cost compares), infinities and negatives turn terms inside out.
        if not math.isfinite(number) or number < 0:
            raise ValueError(f"route weight {name}={raw!r} must be a finite number >= 0")
        values[name] = int(number) if name == "expected_output_tokens" else number
    return dataclasses.replace(PolicyWeights(), **values)  # type: ignore[arg-type]


def make_policy(name: str, settings: Mapping[str, float] | None = None) -> Policy:
    """A fresh policy object by name, with ``settings`` (an anchor's knobs, e.g. llm-d's
    ``kv_weight``) applied; ``ValueError`` for an unknown name or setting."""
    policy = POLICY_CLASSES[check_policy(name)]()
    unknown = sorted(set(settings or {}) - set(policy.settings))
    if unknown:
        known = list(policy.settings) or "none (kv_aware takes weights)"
        raise ValueError(f"unknown setting(s) {unknown} for policy {name!r}; expected {known}")
    for key, value in (settings or {}).items():
        setattr(policy, key, float(value))
    return policy


def parse_policy_settings(items: Sequence[str]) -> dict[str, dict[str, float]]:
    """``["llmd:kv_weight=1,queue_weight=3"]`` -> ``{"llmd": {"kv_weight": 1.0, ...}}``,
    each checked against its policy's settings; ``ValueError`` naming the bad item."""
    out: dict[str, dict[str, float]] = {}
    for item in items:
        name, sep, body = item.partition(":")
        if not sep:
            raise ValueError(f"bad policy setting {item!r}: expected POLICY:NAME=VALUE,...")
        values = out.setdefault(name.strip(), {})
        for pair in body.split(","):
            key, eq, raw = pair.partition("=")
            try:
                value = float(raw) if eq else math.nan
                if not 0 <= value < math.inf:  # weights, windows and caps: finite, >= 0
                    raise ValueError
                values[key.strip()] = value
            except ValueError:
                raise ValueError(
                    f"bad policy setting {pair!r} in {item!r}: expected NAME=VALUE, "
                    "a finite number >= 0"
                ) from None
        make_policy(name.strip(), values)  # validate
    return out
