"""The share term's cache-pressure gate (issue 15): where every working set fits, a
group of sessions is not split to even out load; once engines report hits lost to
eviction, the fair-share term weighs in full again."""

from __future__ import annotations

import random

from _helpers import ScoreStub as Score

from router.routing.policy import PolicyWeights, RouteInput, WorkerView, make_policy
from router.routing.pressure import CachePressure
from router.routing.state import RoutingConfig, RoutingCore


def test_a_shortfall_beyond_the_tolerance_is_a_loss_and_no_hit_is_no_sample() -> None:
    p = CachePressure(window=4.0)
    p.reported(expected=16, cached=0, tolerance=16)  # nothing expected beyond rounding
    assert (p.samples, p.losses, p.loss_rate) == (0, 0, 0.0)
    p.reported(expected=640, cached=640 - 16, tolerance=16)  # the last block recomputed
    assert (p.samples, p.losses, p.loss_rate) == (1, 0, 0.0)
    p.reported(expected=640, cached=300, tolerance=16)  # evicted between route and admit
    assert (p.samples, p.losses) == (2, 1)
    assert p.loss_rate == 0.25 and p.gate(0.5) == 0.5 and p.gate(0.1) == 1.0
    assert p.gate(0.0) == 1.0


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
