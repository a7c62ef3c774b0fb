"""What every routing policy shares: weights, the per-worker view, and the base class.

Split from :mod:`router.routing.policy` so that the anchor re-implementations
(:mod:`router.routing.anchors`) and kvroute's own policies build on one base without an
import cycle; :mod:`router.routing.policy` holds the registry of both.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field

DEFAULT_POLICY = "kv_aware"


@dataclass(frozen=True, slots=True)
class PolicyWeights:
    """Weights of the ``kv_aware`` cost, in prompt-token units.

    Defaults were tuned with ``benchmarks/routing_tune.py`` on the tuning split of the
    routing grid (the Mooncake conversation trace's first 30% and two synthetic mixes at
    seed 1; N in {8, 32}, tight and generous caches, load 0.5 and 0.9; charged engines;
    docs/routing.md): a backlog token weighs 0.15 of a token this request must prefill
    (work saved is saved for good, queueing behind a backlog is brief); the KV held by
    requests in flight 0.03 per token (it scales with request size, so one weight fits
    512-token and 64-token-block workloads alike, where a per-request weight did not);
    and a worker 10% over its fair share of recent tokens pays 10% of the request.
    Round 4: requests of 4096+ tokens weigh a backlog token 0.04 (their cached prefix is
    seconds of prefill), and a prompt with 64k+ tokens uncached goes where its TTFT is
    lowest (its own prefill is the TTFT tail). Round 13: such requests weigh held KV
    0.02 a token, and one cached nowhere weighs its backlog in full while the fleet is
    mostly idle.
    """

    prefill: float = 1.0
    backlog: float = 0.15
    decode: float = 0.0
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
    # Backlog beyond ``knee`` tokens weighs ``backlog_over`` more: short queues are
    # brief and worth waiting for a cache hit; a long prompt in prefill holds every
    # request behind it for seconds (chunked prefill serves it first) -- the TTFT tail.
    # Off by default (on uncapped engines it moves cached turns). Where prefills are
    # capped (``prefill_cap``, ``warm_chunk``) the wait a cached turn sees stays under
    # the knee and only a long prompt of its own behind a long backlog reaches it: 0.25
    # past 32768 in the prefill-shaping profile (round 18), 1 past this default knee in
    # capped-prefill (round 19).
    knee: float = 16_384.0
    backlog_over: float = 0.0
    # Prefill of a token at context c costs ``1 + c / context_tokens`` tokens' worth
    # (attention grows with the context; ~2 x params / (4 x layers x hidden), 30k for
    # Llama-3.1-8B); 0 counts every token alike.
    context_tokens: float = 0.0
    # Each prompt token held by a request in flight on the worker (its KV blocks, read
    # at every decode step, and cache the worker cannot use for new prefixes) weighs
    # ``held`` tokens: scales with request size where ``decode`` (per request) does not.
    held: float = 0.03
    # A worker that received ``x`` more than its fair share (the fleet mean) of recently
    # routed prompt tokens pays ``share * x * request_tokens``: new and movable requests
    # fill the workers that got less, so token totals stay even without moving sessions
    # that have a cache to lose. The window is ``share_window`` routed requests per worker.
    share: float = 1.0
    share_window: float = 64.0
    # The deviation is taken over ``mean + share_prior x request_tokens``: until a few
    # requests' worth of tokens has been routed (a fresh router, a quiet fleet) a worker
    # that got the only request is not "over its share" by N times.
    share_prior: float = 8.0
    # ... fading linearly to ``share_prior_warm`` over the router's first
    # ``share_warmup`` routed requests per worker: a cold router must not balance a cache
    # hit away; a warm one balances harder (8 forever kept the live fleet grouped by
    # system prompt, 1.17-1.33 imbalance), but not with no prior at all (0 lost 1.1
    # points of the Mooncake bound, 4 gained 1.0; docs/routing_rounds.md). 0: never fades.
    # 8 (was 4): held-out grid 27/36 cells (26), imbalance <= 1.10 in 19/36 (15).
    share_warmup: float = 8.0
    share_prior_warm: float = 4.0
    # Where the fleet neither evicts hits nor queues work (``router.routing.pressure``)
    # the share term weighs ``share_roomy`` times as much: spreading a group of sessions
    # over more workers there buys neither hits nor TTFT and prefills their shared prefix
    # again. It weighs in full from a hit-loss rate of ``pressure_knee`` or a mean
    # prefill backlog of ``queue_knee`` requests' worth per worker (0: backlog not
    # looked at) up, linear in between. 1: pressure is not looked at.
    share_roomy: float = 0.5
    pressure_knee: float = 0.1
    queue_knee: float = 0.25
    # ... and ``share_evicting`` times as much from a hit-loss rate of ``pressure_knee``
    # up (linear from no loss) while work does not queue (fading out as the queue depth
    # reaches ``queue_knee``): there the caches, not the engines' time, are what is
    # short, and a group of sessions on one worker evicts its own turns (live tight
    # regime: 0.742-0.761 with 2 against 0.695-0.724; where work queues, the backlog
    # term already spreads it and the extra weight only moved sessions).
    share_evicting: float = 2.0
    # Where the backlog leaves at first tokens, the share of the estimated progress of
    # the request now in prefill (learned speed x time since it started) taken off the
    # worker's backlog; 0 (default) counts it in full until its first token. 1 gave
    # Mooncake +0.2-0.7 points of hits at up to 1.3x the TTFT p99 (docs/routing_rounds.md).
    head_progress: float = 0.0
    # Decisions priced in time (docs/routing_rounds.md, "Pricing in seconds"): a worker's
    # expected TTFT is ``(prefill_backlog + this request's uncached tokens) / speed`` (in
    # tokens at the nominal speed). A request whose best cached share is below
    # ``ttft_below`` (a long new prompt: its own prefill dominates) is placed by that
    # TTFT alone (plus ``held`` and the share term). Any other request leaves the worker
    # its cost picks only when another worker's TTFT is lower by more than
    # ``escape x request_tokens + escape_floor`` (a cached turn stuck behind a long
    # prompt); then it is placed by TTFT too. 0 turns each off.
    ttft_below: float = 0.0
    # Requests of at least ``large_tokens`` (> 0) weigh a backlog token ``backlog_large``
    # instead of ``backlog``: their cached prefixes are worth more seconds of prefill.
    large_tokens: float = 4096.0
    backlog_large: float = 0.04
    # ... and a token they must prefill ``prefill_large`` (a cached token is worth that
    # many): a long session's cache is what its next turns and its neighbours' hits are
    # made of, and moving it for a queue recomputes it and leaves a stale copy behind.
    prefill_large: float = 1.0
    # ... and a prompt token held by a request in flight on the worker ``held_large``:
    # a long session's cached prefix is seconds of prefill, worth more KV held beside it
    # than a chat turn's (round 13, with ``backlog_fresh``: docs/routing_rounds.md).
    held_large: float = 0.02
    # ... and so is one with at least ``ttft_miss`` uncached tokens on its best worker.
    ttft_miss: float = 65_536.0
    # The share term's weight in those TTFT prices (1: as in the token costs).
    ttft_share: float = 1.0
    # A request of ``large_tokens``+ with nothing cached on any worker (beyond a hot
    # prefix) weighs a backlog token ``backlog_fresh`` (0: off) while the fleet's mean
    # share of idle workers (no prefill backlog; averaged over recent requests) is at
    # least ``fresh_idle``: it has no hit to keep, so a queue ahead of it is its TTFT.
    # Round 13 defaults (were 0, 0.03 for ``held_large``): held out 27/36 cells as
    # before, hit rate 31/36 (30), TTFT p50 35/36 (31), p99 28/36 (29); ahead on the
    # mean of three perturbed runs in 4/12 Mooncake cells (2/12).
    backlog_fresh: float = 1.0
    fresh_idle: float = 0.35
    escape: float = 0.0
    escape_floor: float = 0.0
    # The engines' ``--long-prefill-token-threshold`` (vLLM; 0: they do not cap). An
    # engine that caps each prefill at this many tokens a step while others wait serves
    # a short request beside a long prompt instead of after it: a request that must
    # prefill ``u`` tokens waits behind each prefill ahead of it for at most
    # ``max(u, prefill_cap)`` of its tokens, not for all of them.
    prefill_cap: float = 0.0
    # Router-side prefill shaping (0: off): a request that must prefill more than
    # ``warm_chunk`` tokens on its worker is sent as prefix-warming requests of
    # ``warm_chunk``, ``2 x warm_chunk``, ... tokens (one output token each, one after
    # another) and then in full, so the engine caches its prompt a chunk at a time and
    # serves the requests queued meanwhile between chunks: what ``--long-prefill-token-
    # threshold`` does inside an engine, for engines that do not set it. A multiple of the
    # engines' block size. The cost prices waits as with ``prefill_cap`` (the smaller of
    # the two where both are set).
    warm_chunk: float = 0.0
    # ... only while the fleet's mean share of idle workers (``RouteInput.idle``) is at
    # least ``warm_idle``: near saturation a warmed prefix waits behind a queue with its
    # blocks free to evict, and re-computing it costs more than the chunking saves
    # (tight caches at load 0.9: docs/routing_rounds.md).
    warm_idle: float = 0.15
    # ... and only for a request with at most ``warm_cached`` of its prompt expected
    # cached (1: any): between two warming requests nothing holds the cached prefix, so
    # a queue long enough to evict it costs the hit the request was routed for.
    warm_cached: float = 1.0
    # Decode tokens the router assumes per request when the caller does not say.
    expected_output_tokens: int = 256


@dataclass(frozen=True, slots=True)
class EngineStats:
    """What an engine reports about itself (scraped metrics; the simulator's engines).

    The anchors' load scorers read these (llm-d's queue and KV-utilization scorers,
    SGLang's smallest-tree fallback); -1 means "not reported" and each reader falls back
    to the router's own in-flight accounting.
    """

    queue_depth: int = -1
    kv_usage: float = -1.0
    cached_blocks: int = -1


@dataclass(slots=True)
class WorkerView:
    """Everything a policy may look at for one worker. Not frozen: one is built per
    worker per request, and a frozen dataclass's ``__init__`` costs ~2.5x (1.5 vs 0.6 us,
    ~60 us a request at 64 workers); policies only read it."""

    worker_id: str
    hit_tokens: int = 0
    hit_tokens_gpu: int = 0
    score: float = 0.0
    predicted_tokens: int = 0
    inflight: int = 0
    prefill_backlog: float = 0.0
    inflight_decode: float = 0.0
    # Prompt tokens of the requests in flight (their KV blocks: Dynamo's decode blocks).
    inflight_tokens: float = 0.0
    # The worker's prefill speed relative to the fleet's nominal one (learned; 1.0 until
    # the router has observed it).
    speed: float = 1.0
    # Prompt tokens routed to the worker recently (exponentially decayed; the share term).
    recent_tokens: float = 0.0
    engine: EngineStats = field(default_factory=EngineStats)
    # Uncached tokens of each request in prefill on the worker, in dispatch order (only
    # filled where ``PolicyWeights.prefill_cap`` is set: nothing else reads it).
    prefilling: Sequence[float] = ()


@dataclass(frozen=True, slots=True)
class RouteInput:
    request_tokens: int
    hot_tokens: int = 0
    # The engines' block size in tokens (hit step): the anchors count in blocks.
    block_tokens: int = 16
    # Requests the router has routed before this one (the share prior's warm-up).
    routed: int = 0
    # How much the fleet is under pressure, 0..1 (``router.routing.pressure``: the hit-loss
    # rate over ``pressure_knee`` or the queue depth over ``queue_knee``); 1 where it is
    # not measured.
    pressure: float = 1.0
    # The hit-loss rate over ``pressure_knee`` while work does not queue, 0..1
    # (``CachePressure.evicting``; 0 where not measured).
    evicting: float = 0.0
    # The fleet's share of workers with no prefill backlog, averaged over recent requests.
    idle: float = 1.0


@dataclass(frozen=True, slots=True)
class Choice:
    index: int
    loads: list[float] = field(default_factory=list)
    costs: list[float] = field(default_factory=list)


def worker_load(view: WorkerView, weights: PolicyWeights) -> float:
    """Outstanding work on a worker, in prompt-token equivalents."""
    return (
        weights.backlog * view.prefill_backlog
        + weights.decode * view.inflight
        + weights.held * view.inflight_tokens
    )


def share_weight(weights: PolicyWeights, pressure: float, evicting: float) -> float:
    """How many times its full weight the fair-share term weighs: ``share_roomy`` where
    the fleet neither loses hits nor queues (``pressure`` 0), 1 under either, up to
    ``share_evicting`` where caches evict and nothing queues (``evicting`` 1)."""
    roomy = weights.share_roomy
    weight = roomy + (1.0 - roomy) * pressure
    if evicting > 0:
        weight *= 1.0 + (weights.share_evicting - 1.0) * evicting
    return weight


def share_prior_tokens(request: RouteInput, workers: int, weights: PolicyWeights) -> float:
    """The share term's prior in tokens: ``share_prior`` requests' worth, fading to
    ``share_prior_warm`` over the router's first ``share_warmup`` requests per worker
    (never, with 0)."""
    if weights.share_warmup <= 0:
        return weights.share_prior * request.request_tokens
    cold = max(0.0, 1.0 - request.routed / (weights.share_warmup * max(workers, 1)))
    warm = weights.share_prior_warm
    return (warm + (weights.share_prior - warm) * cold) * request.request_tokens


def discount_hot(affinity: float, hot_tokens: int, discount: float) -> float:
    """Count hits inside the hot prefix ``discount`` times, the rest in full."""
    if hot_tokens <= 0 or discount >= 1.0:
        return affinity
    hot = min(affinity, float(hot_tokens))
    return (affinity - hot) + discount * hot


def cache_affinity(view: WorkerView, hot_tokens: int, discount: float) -> float:
    """A worker's cache affinity for a request as ``kv_aware`` counts it: the larger of
    its tier-weighted score and its predicted tokens, hits inside the hot prefix
    discounted (the policy's cost loop inlines the same arithmetic)."""
    cached = view.score if view.score > view.predicted_tokens else float(view.predicted_tokens)
    return discount_hot(cached, hot_tokens, discount)


def prefill_chunk(weights: PolicyWeights) -> float:
    """The most tokens one prefill runs in a step while others wait, as the cost prices
    it: the engines' cap (``prefill_cap``) or the router's warming chunk
    (``warm_chunk``), the smaller where both are set; 0 where neither is."""
    caps = [c for c in (weights.prefill_cap, weights.warm_chunk) if c > 0]
    return min(caps) if caps else 0.0


def warm_prefixes(request_tokens: int, cached_tokens: int, chunk: int) -> tuple[int, ...]:
    """Prompt lengths of the prefix-warming requests for a request of ``request_tokens``
    with ``cached_tokens`` expected cached on its worker: every multiple of ``chunk``
    strictly between the two, so that no request prefills more than ``chunk`` tokens
    (the last, the request itself, prefills what is left)."""
    if chunk <= 0 or request_tokens - cached_tokens <= chunk:
        return ()
    first = cached_tokens // chunk + 1
    return tuple(range(first * chunk, request_tokens, chunk))


def prefill_weight(request_tokens: int, weights: PolicyWeights) -> float:
    """What a token this request must prefill weighs in ``kv_aware``'s cost: ``prefill``,
    ``prefill_large`` from ``large_tokens`` up."""
    return weights.prefill_large if 0 < weights.large_tokens <= request_tokens else weights.prefill


def held_weight(request_tokens: int, weights: PolicyWeights) -> float:
    """What a prompt token held by a request in flight weighs for a request of
    ``request_tokens`` in ``kv_aware``'s cost: ``held``, ``held_large`` from
    ``large_tokens`` up."""
    return weights.held_large if 0 < weights.large_tokens <= request_tokens else weights.held


def backlog_weight(
    request: RouteInput, views: Sequence[WorkerView], weights: PolicyWeights
) -> float:
    """What a backlog token weighs for this request in ``kv_aware``'s cost: ``backlog``;
    ``backlog_large`` from ``large_tokens`` up; ``backlog_fresh`` for such a request
    that no worker holds beyond its hot prefix while the fleet is at least ``fresh_idle``
    idle (it has no hit to keep, so a queue ahead of it is its TTFT)."""
    if not 0 < weights.large_tokens <= request.request_tokens:
        return weights.backlog
    if weights.backlog_fresh > 0 and request.idle >= weights.fresh_idle:
        hot, discount = request.hot_tokens, weights.hot_discount
        if all(cache_affinity(v, hot, discount) <= 0 for v in views):
            return weights.backlog_fresh
    return weights.backlog_large


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
    # Attributes a caller may set per instance (``make_policy``): the knobs the router a
    # policy re-implements exposes; kv_aware's are its ``PolicyWeights``.
    settings: tuple[str, ...] = ()

    def choose(
        self,
        request: RouteInput,
        views: Sequence[WorkerView],
        weights: PolicyWeights,
        rng: random.Random,
    ) -> Choice:
        # worker_load inlined (same arithmetic): it runs for every worker every request.
        b, d, h = weights.backlog, weights.decode, weights.held
        loads = [b * v.prefill_backlog + d * v.inflight + h * v.inflight_tokens for v in views]
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
