"""kv_aware's ``backlog_fresh``: a large request with nothing cached on any worker (beyond
a hot prefix) weighs a queue ahead of it as its TTFT, while the fleet is mostly idle.

Such a request has no hit to keep, so with ``backlog_large`` (0.04) the held and share
terms -- future balance -- would place it behind a queue when an idle worker exists; on
the Mooncake trace that made TTFT p50 at moderate load worse than llm-d's
(docs/routing_rounds.md, "The median at moderate load")."""

from __future__ import annotations

import random

from _helpers import ScoreStub

from router.routing.policy import PolicyWeights, RouteInput, WorkerView, make_policy
from router.routing.state import RoutingConfig, RoutingCore

N = 20_000  # a large request (>= large_tokens)
# A worker with a 10k-token queue and little KV held, and an idle one holding 200k tokens
# of KV for running decodes: held x 200k = 6k outweighs 0.04 x 10k = 400.
QUEUED = WorkerView("queued", inflight=1, prefill_backlog=10_000.0, inflight_tokens=10_000.0)
IDLE = WorkerView("idle", inflight=4, inflight_tokens=200_000.0)
FRESH = dict(backlog_fresh=1.0, fresh_idle=0.35, share=0.0, balance_slack=1e9)


def pick(views: list[WorkerView], weights: PolicyWeights, request: RouteInput) -> str:
    choice = make_policy("kv_aware").choose(request, views, weights, random.Random(0))
    return views[choice.index].worker_id


def test_a_fresh_large_request_goes_where_it_starts_first() -> None:
    off = PolicyWeights(backlog_fresh=0.0, share=0.0, balance_slack=1e9)
    assert pick([QUEUED, IDLE], off, RouteInput(N)) == "queued"
    assert pick([QUEUED, IDLE], PolicyWeights(**FRESH), RouteInput(N)) == "idle"


def test_only_where_nothing_is_cached_beyond_the_hot_prefix() -> None:
    weights = PolicyWeights(**FRESH)
    cached = WorkerView("queued", hit_tokens=2_048, score=2_048.0, inflight=1,
                        prefill_backlog=10_000.0, inflight_tokens=10_000.0)  # fmt: skip
    assert pick([cached, IDLE], weights, RouteInput(N)) == "queued"
    # A hit inside the hot prefix (a system prompt every worker will hold) counts as none.
    hot = RouteInput(N, hot_tokens=2_048)
    assert pick([cached, IDLE], weights, hot) == "idle"


def test_not_for_small_requests_nor_while_the_fleet_is_busy() -> None:
    weights = PolicyWeights(**FRESH)
    small = [
        WorkerView("queued", inflight=1, prefill_backlog=1_000.0, inflight_tokens=1_000.0),
        WorkerView("idle", inflight=4, inflight_tokens=40_000.0),
    ]
    # 2k tokens: below large_tokens, weighs the backlog 0.15 as before (150 < 1.2k held).
    assert pick(small, weights, RouteInput(2_000)) == "queued"
    busy = RouteInput(N, idle=0.2)  # on average 20% of the workers idle: below 0.35
    assert pick([QUEUED, IDLE], weights, busy) == "queued"


def test_the_core_averages_the_share_of_idle_workers() -> None:
    core = RoutingCore(RoutingConfig(weights=PolicyWeights(**FRESH)), clock=lambda: 0.0)
    scores = [ScoreStub("w0", 0, 0, 0.0), ScoreStub("w1", 0, 0, 0.0)]
    assert core.idle == 1.0
    for i in range(64):  # every request leaves a backlog, so both workers fill up
        core.route(f"r{i}", list(range(i * 5_000, (i + 1) * 5_000)), scores)
    assert core.idle < 0.35
    # On by default (round 13); switched off, nothing is averaged.
    assert RoutingConfig().weights.backlog_fresh > 0
    plain = RoutingCore(RoutingConfig(weights=PolicyWeights(backlog_fresh=0.0)), clock=lambda: 0.0)
    for i in range(8):
        plain.route(f"r{i}", list(range(i * 5_000, (i + 1) * 5_000)), scores)
    assert plain.idle == 1.0
