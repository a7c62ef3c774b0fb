"""Router-side prefill shaping (``PolicyWeights.warm_chunk``): which prefix-warming
requests a decision carries, and for which policies (docs/routing_rounds.md, "Prefill shaping")."""

from __future__ import annotations

import random

from _helpers import ScoreStub as Score

from router.routing.base import prefill_chunk, warm_prefixes
from router.routing.policy import PolicyWeights, RouteInput, WorkerView, make_policy
from router.routing.state import RoutingConfig, RoutingCore


def test_warm_prefixes_are_the_chunk_multiples_past_the_cached_prefix() -> None:
    assert warm_prefixes(10_000, 0, 4096) == (4096, 8192)
    assert warm_prefixes(10_000, 5_000, 4096) == (8192,)
    assert warm_prefixes(8192, 0, 4096) == (4096,)  # the request itself prefills the rest
    assert warm_prefixes(4097, 1, 4096) == ()  # no request prefills more than the chunk
    assert warm_prefixes(10_000, 8192, 4096) == ()
    assert warm_prefixes(10_000, 0, 0) == ()  # off


def test_prefill_chunk_is_the_smaller_of_engine_cap_and_warm_chunk() -> None:
    assert prefill_chunk(PolicyWeights()) == 0.0
    assert prefill_chunk(PolicyWeights(warm_chunk=8192)) == 8192
    assert prefill_chunk(PolicyWeights(prefill_cap=4096, warm_chunk=8192)) == 4096


def core(**weights: float) -> RoutingCore:
    return RoutingCore(RoutingConfig(weights=PolicyWeights(**weights), seed=0, inflight_ttl_s=1e9))


def test_kv_aware_decisions_carry_the_warming_prefixes_of_the_chosen_worker() -> None:
    c = core(warm_chunk=4096)
    tokens = list(range(12_000))
    d = c.route("r", tokens, [Score("a", 4096, 4096, 4096.0), Score("b")], now=0.0)
    assert d.worker_id == "a"
    assert d.warm == (8192,)  # 4096 cached there: one warming request, then the request
    assert core().route("r", tokens, [Score("a")], now=0.0).warm == ()  # off by default


def test_the_anchors_never_shape() -> None:
    c = core(warm_chunk=4096)
    for i, policy in enumerate(("dynamo", "sglang", "llmd", "round_robin")):
        d = c.route(f"r{i}", list(range(12_000)), [Score("a")], policy=policy, now=0.0)
        assert d.warm == ()


def test_warming_prices_the_wait_behind_a_long_prefill_as_a_capped_engine() -> None:
    # A 2k-token turn with 1.5k cached on a worker prefilling a 60k-token prompt: waiting
    # for all of it costs more than the hit is worth; with prompts warmed 4k at a time it
    # waits for one chunk of it and keeps the hit.
    busy = WorkerView("busy", hit_tokens=1500, score=1500.0, inflight=1,
                      prefill_backlog=60_000.0, prefilling=(60_000.0,))  # fmt: skip
    idle = WorkerView("idle")
    plain = dict(share=0.0, held=0.0, balance_slack=1e9)

    def pick(weights: PolicyWeights) -> str:
        choice = make_policy("kv_aware").choose(
            RouteInput(2000), [busy, idle], weights, random.Random(0)
        )
        return [busy, idle][choice.index].worker_id

    assert pick(PolicyWeights(**plain)) == "idle"
    assert pick(PolicyWeights(warm_chunk=4096, **plain)) == "busy"


def test_no_warming_while_the_fleet_is_mostly_busy() -> None:
    # Near saturation a warmed prefix waits in a queue with its blocks free to evict.
    c = core(warm_chunk=4096)
    tokens = list(range(12_000))
    warmed = [c.route(f"r{i}", tokens, [Score("a")], now=0.0).warm for i in range(40)]
    assert warmed[0] == (4096, 8192)  # the backlog builds up, nothing finishes
    assert c.idle < PolicyWeights().warm_idle and warmed[-1] == ()
    assert core(warm_chunk=4096, warm_idle=0.0).route("x", tokens, [Score("a")]).warm


def test_no_warming_for_a_request_mostly_cached_where_warm_cached_says_so() -> None:
    # Between two warming requests nothing holds the cached prefix: a request routed for
    # a large hit is sent as it is, so that it holds its blocks from admission on.
    tokens = list(range(30_000))
    mostly = [Score("a", 20_480, 20_480, 20_480.0)]  # 68% cached
    partly = [Score("a", 12_288, 12_288, 12_288.0)]  # 41% cached
    assert core(warm_chunk=4096).route("r", tokens, mostly, now=0.0).warm == (24_576, 28_672)
    gated = dict(warm_chunk=4096, warm_cached=0.5)
    assert core(**gated).route("m", tokens, mostly, now=0.0).warm == ()
    # (A core of its own: the first decision would be predicted cached here.)
    warmed = core(**gated).route("p", tokens, partly, now=0.0).warm
    assert warmed == (16_384, 20_480, 24_576, 28_672)
