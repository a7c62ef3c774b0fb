"""kv_aware's held-KV and fair-share terms (issue 15): what they move and what they keep."""

from __future__ import annotations

import random

from _helpers import ScoreStub as Score

from router.routing.policy import PolicyWeights, RouteInput, WorkerView, make_policy
from router.routing.state import RoutingConfig, RoutingCore

ONLY_HELD = PolicyWeights(backlog=0.0, decode=0.0, held=0.05, share=0.0)


def pick(views: list[WorkerView], weights: PolicyWeights, n: int = 1000) -> str:
    choice = make_policy("kv_aware").choose(RouteInput(n), views, weights, random.Random(0))
    return views[choice.index].worker_id


def test_held_tokens_weigh_by_size_not_by_count() -> None:
    # One request each, but "big" holds 10k prompt tokens of KV: 500 token-equivalents.
    big = WorkerView("big", inflight=1, inflight_tokens=10_000.0)
    small = WorkerView("small", inflight=1, inflight_tokens=100.0)
    assert pick([big, small], ONLY_HELD) == "small"
    # Per request alone (the old decode term) they tie; the held term breaks it.
    per_request = PolicyWeights(backlog=0.0, decode=512.0, held=0.0)
    picks = {
        make_policy("kv_aware")
        .choose(RouteInput(1000), [big, small], per_request, random.Random(s))
        .index
        for s in range(20)
    }
    assert picks == {0, 1}
    # A hit worth more than the held KV still wins; a smaller one does not.
    big_hit = WorkerView("big", hit_tokens=800, score=800.0, inflight=1, inflight_tokens=10_000.0)
    assert pick([big_hit, small], ONLY_HELD) == "big"
    big_small_hit = WorkerView(
        "big", hit_tokens=200, score=200.0, inflight=1, inflight_tokens=10_000.0
    )
    assert pick([big_small_hit, small], ONLY_HELD) == "small"


def test_share_term_scales_with_the_request_and_the_deviation() -> None:
    w = PolicyWeights(backlog=0.0, decode=0.0, held=0.0, share=1.0, share_prior=0.0)
    # "over" got 1.2x the fleet mean of recent tokens: 20% of a 1000-token request.
    over = WorkerView("over", hit_tokens=300, score=300.0, recent_tokens=1200.0)
    under = WorkerView("under", recent_tokens=800.0)
    # cost(over) = 700 + 200 = 900 > cost(under) = 1000 - 200 = 800: the hit is not enough.
    assert pick([over, under], w) == "under"
    # A session with most of its prompt cached stays where its cache is.
    sticky = WorkerView("over", hit_tokens=900, score=900.0, recent_tokens=1200.0)
    assert pick([sticky, under], w) == "over"
    # Without the term the 300-token hit decides.
    assert pick([over, under], PolicyWeights(backlog=0.0, held=0.0, share=0.0)) == "over"


def _imbalance(share: float, seed: int = 3) -> float:
    weights = PolicyWeights(backlog=0.0, decode=0.0, held=0.0, share=share, share_prior=0.0)
    core = RoutingCore(RoutingConfig(weights=weights, seed=seed, inflight_ttl_s=1e9))
    rng = random.Random(seed)
    totals = {"a": 0, "b": 0, "c": 0, "d": 0}
    for i in range(400):
        n = rng.choice((100, 400, 2000))
        scores = [Score(w) for w in totals]
        d = core.route(f"r{i}", [i] * n, scores, now=float(i))
        totals[d.worker_id] += n
    return max(totals.values()) / (sum(totals.values()) / len(totals))


def test_share_term_evens_out_token_totals_through_the_core() -> None:
    # No cache anywhere: without the term every worker ties (random pick); with it, each
    # request fills whichever worker is furthest below its share of recent tokens.
    balanced, random_ties = _imbalance(1.0), _imbalance(0.0)
    assert balanced < 1.03
    assert random_ties > balanced + 0.03


def test_recent_tokens_decay_over_the_window() -> None:
    # 4 requests per worker, 2 workers: a window of 8 routed requests.
    weights = PolicyWeights(backlog=0.0, decode=0.0, held=0.0, share=1.0, share_window=4.0)
    core = RoutingCore(RoutingConfig(weights=weights, seed=0, inflight_ttl_s=1e9))
    core.route("first", [1] * 1000, [Score("a", 999, 999, 999.0), Score("b")], now=0.0)
    assert core.recent == {"a": 1000.0}
    for i in range(8):
        core.route(f"r{i}", [i] * 10, [Score("a"), Score("b", 9, 9, 9.0)], now=0.0)
    # Eight routed requests at 1 - 1/8 each: (7/8)^8 of the first 1000 tokens remain.
    assert abs(core.recent["a"] - 1000.0 * (7 / 8) ** 8) < 1e-6


def test_a_fresh_router_does_not_balance_away_a_cache_hit() -> None:
    # The first request ever went to "a": a is N times its "share" of recent tokens. With
    # the prior (8 requests' worth) that is no reason to give up a half-cached prompt.
    core = RoutingCore(RoutingConfig(seed=0, inflight_ttl_s=1e9))
    scores = [Score(w) for w in "abcd"]
    first = core.route("first", list(range(100)), scores, now=0.0).worker_id
    core.finish("first", now=0.0)
    half = [Score(w, 50, 50, 50.0) if w == first else Score(w) for w in "abcd"]
    assert core.route("second", list(range(100)), half, now=0.0).worker_id == first
    # Without the prior the same decision balances the hit away.
    bare = RoutingCore(
        RoutingConfig(weights=PolicyWeights(share_prior=0.0), seed=0, inflight_ttl_s=1e9)
    )
    first = bare.route("first", list(range(100)), scores, now=0.0).worker_id
    bare.finish("first", now=0.0)
    half = [Score(w, 50, 50, 50.0) if w == first else Score(w) for w in "abcd"]
    assert bare.route("second", list(range(100)), half, now=0.0).worker_id != first


def test_the_share_prior_fades_once_the_router_is_warm() -> None:
    # The same view of the fleet: "a" got 4x the mean of recent tokens and holds half of a
    # 1000-token prompt. A cold router (routed 0) keeps the hit; after share_warmup x N
    # requests the prior is down to share_prior_warm (2) and the fair-share term moves
    # the request, as with share_prior 0. share_warmup 0 keeps the prior forever.
    views = [WorkerView("a", hit_tokens=500, score=500.0, recent_tokens=4000.0)] + [
        WorkerView(w) for w in "bcd"
    ]
    weights = PolicyWeights(
        backlog=0.0, held=0.0, share=1.0, share_prior=8.0, share_warmup=4.0, share_prior_warm=2.0
    )
    policy = make_policy("kv_aware")

    def chosen(routed: int, w: PolicyWeights) -> str:
        choice = policy.choose(RouteInput(1000, routed=routed), views, w, random.Random(0))
        return views[choice.index].worker_id

    assert chosen(0, weights) == "a"
    assert chosen(16, weights) != "a"
    assert chosen(16, PolicyWeights(backlog=0.0, held=0.0, share=1.0, share_prior=0.0)) != "a"
    forever = PolicyWeights(backlog=0.0, held=0.0, share=1.0, share_prior=8.0, share_warmup=0.0)
    assert chosen(16, forever) == "a"


def test_the_core_counts_routed_requests_for_the_warm_up() -> None:
    core = RoutingCore(RoutingConfig(seed=0, inflight_ttl_s=1e9))
    scores = [Score(w) for w in "ab"]
    for i in range(3):
        core.route(f"r{i}", list(range(10)), scores, now=0.0)
    assert core.routed_total == 3


def test_head_progress_takes_the_prefilled_part_of_the_head_off_the_backlog() -> None:
    # Backlog leaves at first tokens (prefill_tps 0); the router's speed estimate is the
    # nominal 16k tokens/s until it has learned one. 0.5 s after dispatch, 8,000 of the
    # head request's 10,000 uncached tokens are estimated done.
    def backlog_seen(share: float) -> float:
        weights = PolicyWeights(head_progress=share)
        core = RoutingCore(RoutingConfig(weights=weights, prefill_tps=0.0, seed=0))
        core.route("head", list(range(10_000)), [Score("a")], now=0.0)
        decision = core.route("next", list(range(100)), [Score("a")], now=0.5)
        return decision.views[0].prefill_backlog

    assert backlog_seen(0.0) == 10_000.0
    assert backlog_seen(1.0) == 2_000.0
    assert backlog_seen(0.5) == 6_000.0
