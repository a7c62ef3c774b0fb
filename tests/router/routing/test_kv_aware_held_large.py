"""kv_aware's ``held_large``: the held term's weight for requests of ``large_tokens``+,
apart from ``held`` (which small requests keep), as ``backlog_large`` is apart from
``backlog``. A long session's cached prefix is seconds of prefill; whether the KV held
by a worker's running requests should outweigh it is a separate question from a chat
turn's (docs/routing_rounds.md, "The held term for large requests")."""

from __future__ import annotations

import random

from router.routing.policy import PolicyWeights, RouteInput, WorkerView, make_policy

PLAIN = dict(share=0.0, balance_slack=1e9)


def pick(views: list[WorkerView], weights: PolicyWeights, n: int) -> str:
    choice = make_policy("kv_aware").choose(RouteInput(n), views, weights, random.Random(0))
    return views[choice.index].worker_id


def test_a_large_request_weighs_held_kv_with_held_large() -> None:
    # 20k tokens, 6k cached on a worker whose running requests hold 300k tokens of KV:
    # 14k + 0.03 x 300k = 23k against 20k on an empty worker; with 0.01, 17k.
    assert PolicyWeights().held_large < PolicyWeights().held  # round 13's defaults
    cached = WorkerView("cached", hit_tokens=6_000, score=6_000.0, inflight=4,
                        inflight_tokens=300_000.0)  # fmt: skip
    empty = WorkerView("empty")
    assert pick([cached, empty], PolicyWeights(held_large=0.03, **PLAIN), 20_000) == "empty"
    assert pick([cached, empty], PolicyWeights(held_large=0.01, **PLAIN), 20_000) == "cached"


def test_a_small_request_keeps_held() -> None:
    # 2k tokens, 600 cached behind 30k tokens of held KV: 1.4k + 0.03 x 30k = 2.3k > 2k.
    cached = WorkerView("cached", hit_tokens=600, score=600.0, inflight=1,
                        inflight_tokens=30_000.0)  # fmt: skip
    empty = WorkerView("empty")
    for held_large in (0.03, 0.02, 0.0):
        weights = PolicyWeights(held_large=held_large, **PLAIN)
        assert pick([cached, empty], weights, 2_000) == "empty"
    assert pick([cached, empty], PolicyWeights(held=0.01, **PLAIN), 2_000) == "cached"
