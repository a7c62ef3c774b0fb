"""kv_aware where engines cap long prefills (``prefill_cap``: vLLM's
``--long-prefill-token-threshold``): a short request waits behind each prefill ahead of
it for at most one chunk, not for the whole long prompt."""

from __future__ import annotations

import random

from _helpers import ScoreStub

from router.routing.inflight import InflightTable
from router.routing.policy import PolicyWeights, RouteInput, WorkerView, make_policy
from router.routing.state import RoutingConfig, RoutingCore

# Only the terms under test: no held KV, no fair share, no balance guard.
BASE = dict(backlog=0.15, backlog_large=0.15, held=0.0, share=0.0, balance_slack=1e9)


def pick(views: list[WorkerView], weights: PolicyWeights, n: int) -> str:
    choice = make_policy("kv_aware").choose(RouteInput(n), views, weights, random.Random(0))
    return views[choice.index].worker_id


def behind_a_long_prompt(cached: int) -> WorkerView:
    # One 100k-token prompt in prefill on the worker that holds this request's prefix.
    return WorkerView(
        "cached", hit_tokens=cached, score=float(cached), inflight=1,
        prefill_backlog=100_000.0, prefilling=(100_000.0,),
    )  # fmt: skip


def test_a_cached_turn_stays_where_the_engine_serves_it_beside_the_long_prompt() -> None:
    # 8k tokens, 7k cached: 1k + 0.15 x 100k = 16k on its cache against 8k on an idle
    # worker -- without a cap it leaves (it would wait for the whole long prefill).
    views = [behind_a_long_prompt(7_000), WorkerView("idle")]
    assert pick(views, PolicyWeights(**BASE), 8_000) == "idle"
    # With a 4096-token cap it waits for one chunk of the long prompt: 1k + 0.15 x 4096.
    assert pick(views, PolicyWeights(**BASE, prefill_cap=4096), 8_000) == "cached"


def test_a_long_request_still_waits_for_what_it_shares() -> None:
    # 60k uncached tokens beside a 100k prefill: both run at once, so the long prompt
    # ahead takes up to 60k of the engine's throughput while this one prefills.
    views = [behind_a_long_prompt(4_000), WorkerView("idle")]
    weights = PolicyWeights(**BASE, prefill_cap=4096)
    assert pick(views, weights, 64_000) == "idle"  # 60k + 0.15 x 60k > 64k
    costs = make_policy("kv_aware").costs(RouteInput(64_000), views, [0.0, 0.0], weights)
    assert costs[0] == 60_000 + 0.15 * 60_000


def test_the_capped_wait_never_exceeds_the_backlog() -> None:
    # The backlog drained by the router's rate estimate may be below the items' sum.
    view = WorkerView("w", prefill_backlog=1_000.0, prefilling=(50_000.0, 50_000.0), inflight=2)
    weights = PolicyWeights(**BASE, prefill_cap=4096)
    costs = make_policy("kv_aware").costs(RouteInput(2_000), [view], [0.0], weights)
    assert costs == [2_000 + 0.15 * 1_000]
    # Several prefills ahead: one chunk of each.
    view.prefill_backlog = 100_000.0
    costs = make_policy("kv_aware").costs(RouteInput(2_000), [view], [0.0], weights)
    assert costs == [2_000 + 0.15 * 2 * 4096]


def test_inflight_lists_the_prefills_not_yet_over_in_dispatch_order() -> None:
    table = InflightTable()
    table.add("a", "w", 0.0, prefill_tokens=100.0)
    table.add("b", "w", 0.0, prefill_tokens=0.0)  # fully cached: nothing to prefill
    table.add("c", "w", 0.0, prefill_tokens=30.0)
    table.add("d", "x", 0.0, prefill_tokens=5.0)
    assert table.prefilling_tokens("w") == [100.0, 30.0]
    table.first_token("a")
    assert table.prefilling_tokens("w") == [30.0]
    table.finish("c")
    assert table.prefilling_tokens("w") == [] and table.prefilling_tokens("idle") == []


def test_the_core_fills_the_prefill_list_only_when_the_cap_is_set() -> None:
    def views(weights: PolicyWeights) -> list[WorkerView]:
        core = RoutingCore(RoutingConfig(weights=weights), clock=lambda: 0.0)
        scores = [ScoreStub("w0", 0, 0, 0.0), ScoreStub("w1", 0, 0, 0.0)]
        first = core.route("r1", list(range(5_000)), scores)
        second = core.route("r2", list(range(10_000, 12_000)), scores)
        by_id = {v.worker_id: v for v in second.views}
        assert first.worker_id in by_id
        return [by_id[first.worker_id]]

    assert list(views(PolicyWeights(prefill_cap=4096))[0].prefilling) == [5_000.0]
    assert list(views(PolicyWeights())[0].prefilling) == []


def test_the_prefill_queue_does_not_keep_requests_that_left_it() -> None:
    # Every dispatch with uncached tokens joins its worker's prefill queue; requests past
    # their prefill must leave it (it used to keep every request ever dispatched, and
    # prefilling_tokens walked all of them on every route).
    table = InflightTable(ttl=10.0)
    for i in range(1_000):
        table.add(f"r{i}", "w", float(i), prefill_tokens=100.0)
        if i % 3:
            table.first_token(f"r{i}")
        if i % 2:
            table.finish(f"r{i}")
    table.expire(2_000.0)  # the rest time out
    assert len(table) == 0
    assert table._prefilling == {}
    # A request still in prefill at the head keeps only those dispatched after it.
    table.add("head", "w", 0.0, prefill_tokens=500.0)
    for i in range(100):
        table.add(f"t{i}", "w", 0.0, prefill_tokens=10.0)
        table.first_token(f"t{i}")
        table.finish(f"t{i}")
    assert table.prefilling_tokens("w") == [500.0]
    table.first_token("head")
    assert table._prefilling == {} and table.prefill_head("w") is None
