"""The share term's cache-pressure gate (issue 15): where every working set fits, a
group of sessions is not split to even out load; once engines report hits lost to
eviction, the fair-share term weighs in full again."""

from __future__ import annotations

import random

from _helpers import ScoreStub as Score

from router.routing.policy import PolicyWeights, RouteInput, WorkerView, make_policy
from router.routing.pressure import CachePressure
from router.routing.state import RoutingConfig, RoutingCore


def test_an_engine_report_below_the_estimate_is_a_loss_and_no_hit_is_no_sample() -> None:
    p = CachePressure(window=4.0)
    p.reported(expected=0, cached=0)  # nothing expected: no evidence
    assert (p.samples, p.losses, p.loss_rate) == (0, 0, 0.0)
    p.reported(expected=640, cached=640)  # the estimate held
    assert (p.samples, p.losses, p.loss_rate) == (1, 0, 0.0)
    p.reported(expected=640, cached=624)  # one block evicted between route and admit
    assert (p.samples, p.losses, p.reports, p.reports_lost) == (2, 1, 2, 1)
    assert p.loss_rate == 0.25 and p.gate(0.5) == 0.5 and p.gate(0.1) == 1.0
    assert p.gate(0.0) == 1.0


def test_a_continuation_checks_its_earlier_prompt_on_the_worker_it_went_to() -> None:
    p = CachePressure(window=1.0)
    first = [11, 12, 13]  # prefix keys of a 3-key prompt (64 tokens a key)
    p.remember(first, "r0", "a")
    later = [*first, 14, 15]  # the next turn: the same prefix, extended

    def never(_: str) -> bool:
        return False

    p.continued(later, 64, {"a": 192}.get, never)  # all 192 tokens still on "a"
    assert (p.continuations, p.continuations_lost, p.loss_rate) == (1, 0, 0.0)
    p.continued(later, 64, {"a": 128}.get, never)  # its last key's tokens evicted
    assert (p.continuations, p.continuations_lost, p.loss_rate) == (2, 1, 1.0)
    # No evidence: the earlier request is still prefilling, or its worker is gone, or
    # the request continues nothing the router routed.
    p.continued(later, 64, {"a": 0}.get, lambda rid: rid == "r0")
    p.continued(later, 64, {"b": 0}.get, never)
    # ... or it is the earlier prompt itself again (a retry, a replayed conversation):
    # after a cache reset that would read as evicted.
    p.continued(first, 64, {"a": 0}.get, never)
    p.continued([21, 22], 64, {"a": 0}.get, never)
    assert p.continuations == 2


def test_the_queue_depth_opens_the_gate_as_the_loss_rate_does() -> None:
    p = CachePressure(window=1.0)
    p.queued(mean_backlog=500.0, request_tokens=1000)  # half a request's worth waits
    assert p.queue_depth == 0.5
    assert p.gate(0.1, queue_knee=1.0) == 0.5 and p.gate(0.1, queue_knee=0.25) == 1.0
    assert p.gate(0.1) == 0.0  # queue_knee 0: the queue is not looked at


def test_the_core_finds_continuations_through_its_own_routing() -> None:
    core = RoutingCore(RoutingConfig(seed=0, inflight_ttl_s=1e9, prefix_block_tokens=64))
    turn = list(range(640))
    first = core.route("t0", turn, [Score("a"), Score("b")], now=0.0).worker_id
    core.finish("t0", now=0.0)
    nxt = turn + list(range(1000, 1200))
    # The index holds only the first 320 of its 640 tokens there: a hit lost to eviction.
    part = [Score(w, 320, 320, 320.0) if w == first else Score(w) for w in "ab"]
    core.route("t1", nxt, part, now=0.0)
    assert (core.pressure.continuations, core.pressure.continuations_lost) == (1, 1)
    core.finish("t1", now=0.0)
    held = [Score(w, 640, 640, 640.0) if w == first else Score(w) for w in "ab"]
    core.route("t2", turn + list(range(1000, 1100)), held, now=0.0)
    assert (core.pressure.continuations, core.pressure.continuations_lost) == (2, 1)


WEIGHTS = PolicyWeights(backlog=0.0, held=0.0, share=1.0, share_prior=0.0, share_roomy=0.0)
# "a" holds 300 of a 1000-token prompt and got 1.5x its share of recent tokens.
VIEWS = [
    WorkerView("a", hit_tokens=300, score=300.0, recent_tokens=1500.0),
    WorkerView("b", recent_tokens=500.0),
]


def chosen(pressure: float, weights: PolicyWeights = WEIGHTS) -> str:
    request = RouteInput(1000, pressure=pressure)
    return VIEWS[
        make_policy("kv_aware").choose(request, VIEWS, weights, random.Random(0)).index
    ].worker_id


def test_share_roomy_scales_the_share_term_by_the_pressure() -> None:
    # Full share term: 700 + 500 on "a" against 1000 - 500 on "b": the hit moves.
    assert chosen(1.0) == "b"
    # No pressure measured: the term weighs share_roomy (0) times: the hit stays.
    assert chosen(0.0) == "a"
    # share_roomy 1 (pressure not looked at): the pressure changes nothing.
    assert chosen(0.0, PolicyWeights(backlog=0.0, held=0.0, share=1.0, share_prior=0.0)) == "b"


def test_the_core_learns_pressure_from_engine_reports_and_then_balances() -> None:
    weights = PolicyWeights(
        backlog=0.0, held=0.0, share=1.0, share_prior=0.0, share_prior_warm=0.0, share_roomy=0.0
    )
    core = RoutingCore(RoutingConfig(weights=weights, seed=0, inflight_ttl_s=1e9))
    core.recent.update({"a": 1500.0, "b": 500.0})
    scores = [Score("a", 300, 300, 300.0), Score("b")]
    # (Different prompts each time: the router's own prediction of where a prompt it
    # routed is cached would otherwise keep them on "a".)
    assert core.route("r0", [0] * 1000, scores, now=0.0).worker_id == "a"
    # Engines report the hits as estimated: still roomy, still no split.
    for _ in range(8):
        core.observe_cached(300, 300)
    core.recent.update({"a": 1500.0, "b": 500.0})
    assert core.route("r1", [1] * 1000, scores, now=0.0).worker_id == "a"
    # Hits lost to eviction: the gate opens and the fair-share term moves the request.
    for _ in range(8):
        core.observe_cached(300, 0)
    assert core.pressure.loss_rate > weights.pressure_knee
    core.recent.update({"a": 1500.0, "b": 500.0})
    assert core.route("r2", [2] * 1000, scores, now=0.0).worker_id == "b"


def test_with_the_defaults_a_roomy_idle_fleet_keeps_a_group_together() -> None:
    # The live roomy benchmark's decision: a new conversation whose system prompt (300 of
    # its 1000 tokens) is cached on "a", which got more than its share of recent tokens.
    core = RoutingCore(RoutingConfig(seed=0, inflight_ttl_s=1e9))
    core.routed_total = 10_000  # warm: the share prior is down to share_prior_warm
    scores = [Score("a", 300, 300, 300.0), Score("b")]

    def route(rid: str, tokens: list[int]) -> str:
        core.recent.update({"a": 3000.0, "b": 1000.0})
        worker = core.route(rid, tokens, scores, now=0.0).worker_id
        core.finish(rid, now=0.0)
        return worker

    # Nothing evicted, nothing queued: splitting the group would only prefill its prefix
    # twice, so the hit stays.
    assert route("r0", [0] * 1000) == "a"
    # Hits lost to eviction: the fair-share term weighs in full and spreads the group.
    for _ in range(16):
        core.observe_cached(300, 0)
    assert route("r1", [1] * 1000) == "b"
    # share_roomy 1 (the defaults before round 8): spread even with no pressure.
    before = RoutingCore(RoutingConfig(weights=PolicyWeights(share_roomy=1.0), seed=0))
    before.routed_total = 10_000
    before.recent.update({"a": 3000.0, "b": 1000.0})
    assert before.route("r0", [0] * 1000, scores, now=0.0).worker_id == "b"


def test_share_evicting_weighs_the_share_term_more_where_caches_evict() -> None:
    # "a" holds 600 of a 1000-token prompt and got 1.2x its share: with the share term
    # in full the hit stays; twice as heavy, the request spreads.
    views = [
        WorkerView("a", hit_tokens=600, score=600.0, recent_tokens=1200.0),
        WorkerView("b", recent_tokens=800.0),
    ]
    policy = make_policy("kv_aware")

    def pick(evicting: float, share_evicting: float) -> str:
        weights = PolicyWeights(
            backlog=0.0, held=0.0, share_prior=0.0, share_evicting=share_evicting
        )
        request = RouteInput(1000, pressure=1.0, evicting=evicting)
        return views[policy.choose(request, views, weights, random.Random(0)).index].worker_id

    assert pick(0.0, 2.0) == "a"  # a = 400 + 200 against b = 1000 - 200
    assert pick(1.0, 2.0) == "b"  # a = 400 + 400 against b = 1000 - 400
    assert pick(1.0, 1.0) == "a"  # share_evicting 1: the loss rate adds nothing


def test_evicting_counts_lost_hits_only_while_work_does_not_queue() -> None:
    p = CachePressure(window=1.0)
    assert p.evicting(0.1, 0.25) == 0.0
    p.reported(expected=640, cached=0)  # a hit lost to eviction
    assert p.evicting(0.1, 0.25) == 1.0
    # The same loss with half a request's worth queued per worker: the queue (and so
    # the backlog term) is what spreads work there, not the cache.
    p.queued(mean_backlog=500.0, request_tokens=1000)
    assert p.evicting(0.1, 0.25) == 0.0 and p.gate(0.1, 0.25) == 1.0
    p.queued(mean_backlog=62.5, request_tokens=1000)  # a quarter of the knee: 3/4 calm
    assert p.evicting(0.1, 0.25) == 0.75
    assert p.evicting(0.0, 0.25) == 0.0 and p.evicting(0.1, 0.0) == 0.0


def test_the_core_spreads_harder_once_engines_report_evictions() -> None:
    def core_with(share_evicting: float) -> RoutingCore:
        weights = PolicyWeights(
            backlog=0.0,
            held=0.0,
            share_prior=0.0,
            share_prior_warm=0.0,
            share_evicting=share_evicting,
        )
        return RoutingCore(RoutingConfig(weights=weights, seed=0, inflight_ttl_s=1e9))

    scores = [Score("a", 600, 600, 600.0), Score("b")]
    for share_evicting, after in ((2.0, "b"), (1.0, "a")):
        core = core_with(share_evicting)
        core.recent.update({"a": 1200.0, "b": 800.0})
        assert core.route("r0", [0] * 1000, scores, now=0.0).worker_id == "a"
        core.finish("r0", now=0.0)
        for _ in range(16):
            core.observe_cached(600, 0)  # the engines lost the hits the index promised
        core.recent.update({"a": 1200.0, "b": 800.0})
        assert core.route("r1", [1] * 1000, scores, now=0.0).worker_id == after


def test_the_share_weight_reads_the_gate_and_the_eviction_boost() -> None:
    core = RoutingCore(RoutingConfig(seed=0))  # the defaults: 0.5 roomy, 2 evicting
    assert core.share_weight() == 0.5  # nothing measured: a roomy, idle fleet
    for _ in range(64):
        core.observe_cached(300, 0)
    assert core.share_weight() == 2.0  # hits lost, nothing queued
    for _ in range(64):
        core.pressure.queued(mean_backlog=1000.0, request_tokens=1000)
    assert core.share_weight() == 1.0  # hits lost, but work queues: the full weight
