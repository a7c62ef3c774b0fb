"""kv_aware's ``prefill_large``: what a token a request of ``large_tokens``+ must prefill
weighs against the load terms, apart from ``prefill`` (which small requests keep). A long
session's cache is what its next turns hit; moving a turn off it for a queue recomputes
that cache and leaves a stale copy behind (docs/routing_rounds.md, "llm-d as deployed, and long
sessions that keep their cache (round 17)")."""

from __future__ import annotations

import random

from router.routing.policy import PolicyWeights, RouteInput, WorkerView, make_policy

PLAIN = dict(share=0.0, balance_slack=1e9)


def pick(views: list[WorkerView], weights: PolicyWeights, n: int) -> str:
    choice = make_policy("kv_aware").choose(RouteInput(n), views, weights, random.Random(0))
    return views[choice.index].worker_id


def test_a_large_turn_stays_on_its_cache_behind_a_queue_with_prefill_large() -> None:
    # 12k tokens, 10k cached on a worker with 90k tokens of backlog (a new long session
    # in prefill) and 200k held: 2k + 0.04 x 90k + 0.02 x 200k = 9.6k against 12k on an
    # empty worker with 1; with 2, 4k + 7.6k = 11.6k against 24k.
    busy = WorkerView("cached", hit_tokens=10_000, score=10_000.0, inflight=3,
                      prefill_backlog=90_000.0, inflight_tokens=200_000.0)  # fmt: skip
    empty = WorkerView("empty")
    assert pick([busy, empty], PolicyWeights(prefill_large=1.0, **PLAIN), 12_000) == "cached"
    far = WorkerView("cached", hit_tokens=10_000, score=10_000.0, inflight=3,
                     prefill_backlog=150_000.0, inflight_tokens=250_000.0)  # fmt: skip
    # 2k + 6k + 5k = 13k > 12k: moved at 1; 4k + 11k = 15k < 24k: kept at 2.
    assert pick([far, empty], PolicyWeights(prefill_large=1.0, **PLAIN), 12_000) == "empty"
    assert pick([far, empty], PolicyWeights(prefill_large=2.0, **PLAIN), 12_000) == "cached"


def test_a_small_request_keeps_prefill() -> None:
    # 2k tokens, 1.5k cached behind 5k of backlog: 500 + 0.15 x 5k = 1.25k < 2k (stays);
    # behind 12k: 500 + 1.8k = 2.3k > 2k -- moved whatever prefill_large says.
    far = WorkerView("cached", hit_tokens=1_500, score=1_500.0, inflight=1,
                     prefill_backlog=12_000.0)  # fmt: skip
    empty = WorkerView("empty")
    for prefill_large in (1.0, 2.0, 4.0):
        weights = PolicyWeights(prefill_large=prefill_large, **PLAIN)
        assert pick([far, empty], weights, 2_000) == "empty"
    assert pick([far, empty], PolicyWeights(prefill=2.0, **PLAIN), 2_000) == "cached"
