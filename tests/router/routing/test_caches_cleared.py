"""RoutingCore.caches_cleared: an engine's cache reset (AllBlocksCleared) ends its share of
recent requests, and a fleet-wide reset restarts the share prior's warm-up."""

from __future__ import annotations

import itertools

from _helpers import ScoreStub as Score

from router.routing.policy import PolicyWeights
from router.routing.state import RoutingConfig, RoutingCore

# Only the fair-share term, in full, without a prior: the decisions below are its.
SHARE_ONLY = PolicyWeights(
    backlog=0.0, decode=0.0, held=0.0, share=1.0, share_roomy=1.0, share_prior=0.0
)
PROMPT = 1000
_prompts = itertools.count()  # every request a prompt of its own (no shared prefixes)


def _core(weights: PolicyWeights | None = None) -> RoutingCore:
    return RoutingCore(RoutingConfig(weights=weights or PolicyWeights(), seed=0))


def _route(core: RoutingCore, rid: str, scores: list[Score], policy: str = "kv_aware") -> str:
    """Route a ``PROMPT``-token request and finish it (no in-flight load stays)."""
    tokens = [next(_prompts) + 1] * PROMPT
    worker = core.route(rid, tokens, scores, policy=policy, now=0.0).worker_id
    core.finish(rid, now=0.0)
    return worker


def _burst(core: RoutingCore) -> None:
    """One request on b, then a cache-blind policy piles 16 onto a, where a prefix is."""
    assert _route(core, "b0", [Score("b")]) == "b"
    cached_on_a = [Score("a", 300, 300, 300.0), Score("b")]
    for i in range(16):
        assert _route(core, f"lp{i}", cached_on_a, policy="longest_prefix") == "a"


def test_a_cleared_worker_loses_its_share_and_gets_the_next_requests() -> None:
    core = _core(SHARE_ONLY)
    _burst(core)
    assert core.recent["a"] > 10 * core.recent["b"] > 0
    nowhere = [Score("a"), Score("b")]
    # A new prompt cached nowhere: the share term steers it away from a's burst ...
    assert _route(core, "before", nowhere) == "b"
    # ... until a's engine reset its cache: a holds nothing now, like a new worker.
    b_share = core.recent["b"]
    core.caches_cleared("a")
    assert core.recent["a"] == 0.0 and core.recent["b"] == b_share
    assert _route(core, "after", nowhere) == "a"


def test_a_fleet_wide_reset_restarts_the_warm_up() -> None:
    core = _core()
    _burst(core)
    core.route("held", [1] * PROMPT, [Score("a"), Score("b")], now=0.0)  # still in flight
    assert core.routed_total == 18
    core.caches_cleared("a")
    assert core.routed_total == 18  # b still holds what was routed there
    core.caches_cleared("b")
    assert core.routed_total == 0  # every engine reset, nothing routed since: cold
    assert core.recent == {"a": 0.0, "b": 0.0}
    # What is still running stays counted; the per-policy counters (metrics) stay.
    assert sum(core.inflight_by_worker().values()) == 1
    assert core.routed["longest_prefix"] == 16 and core.routed["kv_aware"] == 2
    # A worker the core never routed to is not added to the window.
    core.caches_cleared("c")
    assert "c" not in core.recent


def test_a_request_routed_between_the_clears_keeps_the_warm_up() -> None:
    core = _core()
    _burst(core)
    core.caches_cleared("a")
    _route(core, "between", [Score("a"), Score("b")])
    core.caches_cleared("b")
    assert core.routed_total == 18  # a may hold the request routed after its clear
    # Cleared again, with nothing routed since b's clear: now the whole fleet is empty.
    core.caches_cleared("a")
    assert core.routed_total == 0


def test_a_removed_worker_does_not_hold_back_the_fleet_wide_reset() -> None:
    core = _core()
    _burst(core)  # a and b in the window; b is then removed from the fleet
    core.caches_cleared("a")
    assert core.routed_total == 17  # without the fleet: b, gone, is still in the window
    core.caches_cleared("a", fleet=["a"])
    assert core.routed_total == 0  # the registered fleet is a alone, and a is empty
