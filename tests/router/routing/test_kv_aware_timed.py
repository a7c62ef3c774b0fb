"""kv_aware's time-priced terms (issue 15, round 4): long uncached prompts by TTFT, and
the escape rule (measured, off by default)."""

from __future__ import annotations

import random

from router.routing.policy import PolicyWeights, RouteInput, WorkerView, make_policy

# Only the terms under test: no held KV, no fair share, no balance guard.
BASE = dict(backlog=0.04, decode=0.0, held=0.0, share=0.0, balance_slack=1e9)


def pick(views: list[WorkerView], weights: PolicyWeights, n: int) -> str:
    choice = make_policy("kv_aware").choose(RouteInput(n), views, weights, random.Random(0))
    return views[choice.index].worker_id


def test_a_long_uncached_prompt_goes_where_it_starts_first() -> None:
    # 100k tokens, 4k cached on "cached" behind a 60k backlog; "idle" has nothing queued.
    # Token cost: 96k + 0.04 x 60k = 98.4k < 100k, so the backlog term keeps it with its
    # 4k of cache -- and it waits 60k tokens' worth. Priced by TTFT: 156k vs 100k.
    cached = WorkerView("cached", hit_tokens=4096, score=4096.0, prefill_backlog=60_000.0)
    idle = WorkerView("idle")
    assert pick([cached, idle], PolicyWeights(**BASE, ttft_miss=0.0), 100_000) == "cached"
    assert pick([cached, idle], PolicyWeights(**BASE, ttft_miss=65_536.0), 100_000) == "idle"
    # The default prices it by TTFT (tuning split; docs/routing_rounds.md, "Pricing in seconds").
    assert PolicyWeights().ttft_miss == 65_536.0
    assert pick([cached, idle], PolicyWeights(**BASE), 100_000) == "idle"
    # A long prompt with most of it cached is not a "long uncached" one.
    mostly = WorkerView("cached", hit_tokens=90_000, score=90_000.0, prefill_backlog=60_000.0)
    assert pick([mostly, idle], PolicyWeights(**BASE, ttft_miss=65_536.0), 100_000) == "cached"


def test_a_mostly_cached_turn_keeps_its_cache_behind_a_queue() -> None:
    # A 28k-token turn with 27k cached: 1k uncached, far below ttft_miss -- token costs
    # decide, and 27k of hits outweigh 0.04 x a 111k backlog (4.4k).
    turn = WorkerView("cached", hit_tokens=27_648, score=27_648.0, prefill_backlog=111_000.0)
    idle = WorkerView("idle")
    assert pick([turn, idle], PolicyWeights(**BASE, ttft_miss=65_536.0), 28_065) == "cached"
    # A short prompt with little cached is not priced by TTFT either (below the floor).
    short = WorkerView("cached", hit_tokens=500, score=500.0, prefill_backlog=5_000.0)
    assert pick([short, idle], PolicyWeights(**BASE, ttft_miss=65_536.0), 2_000) == "cached"
    # ttft_below prices it by time: 500 cached is under 50% of 2,000.
    by_share = PolicyWeights(**BASE, ttft_below=0.5)
    assert pick([short, idle], by_share, 2_000) == "idle"


def test_escape_rules_out_only_the_workers_past_the_threshold() -> None:
    turn = WorkerView("cached", hit_tokens=27_648, score=27_648.0, prefill_backlog=111_000.0)
    half = WorkerView("half", hit_tokens=14_000, score=14_000.0, prefill_backlog=20_000.0)
    idle = WorkerView("idle")
    views = [turn, half, idle]
    # TTFTs (tokens): cached 111.4k, half 34.1k, idle 28.1k. Without the rule the 27k hit
    # wins; with escape=2 (56k over the fastest) "cached" is ruled out and, of the rest,
    # token costs prefer the half-cached worker over the idle one.
    assert pick(views, PolicyWeights(**BASE), 28_065) == "cached"
    assert pick(views, PolicyWeights(**BASE, escape=2.0), 28_065) == "half"
    # A threshold above the wait keeps the cache.
    assert pick(views, PolicyWeights(**BASE, escape=4.0), 28_065) == "cached"
    assert pick(views, PolicyWeights(**BASE, escape_floor=200_000.0), 28_065) == "cached"


def test_a_large_request_weighs_the_backlog_less() -> None:
    w = dict(decode=0.0, held=0.0, share=0.0, balance_slack=1e9, ttft_miss=0.0)
    # 10k tokens, 2k cached behind a 30k backlog. At 0.15 a backlog token: 8k + 4.5k =
    # 12.5k > 10k on the idle worker, so it moves; at 0.04 (large requests): 9.2k, stays.
    cached = WorkerView("cached", hit_tokens=2000, score=2000.0, prefill_backlog=30_000.0)
    idle = WorkerView("idle")
    small_only = PolicyWeights(**w, backlog=0.15, large_tokens=0.0)
    assert pick([cached, idle], small_only, 10_000) == "idle"
    sized = PolicyWeights(**w, backlog=0.15, large_tokens=4096.0, backlog_large=0.04)
    assert pick([cached, idle], sized, 10_000) == "cached"
    # Below large_tokens the backlog weighs 0.15: 1k cached of 3k behind 30k moves.
    small = WorkerView("cached", hit_tokens=1000, score=1000.0, prefill_backlog=30_000.0)
    assert pick([small, idle], sized, 3000) == "idle"


def test_ttft_share_weighs_the_share_term_in_the_ttft_prices() -> None:
    w = dict(BASE, share=1.0, share_prior=0.0, share_warmup=0.0, ttft_miss=65_536.0)
    # A 96k-token prompt: "under" got 20% less than the fleet's mean of recent tokens but
    # has 14.7k tokens queued; "idle" got 20% more and has none. The share term is worth
    # 19.2k tokens either way, enough to outweigh the queue unless ttft_share mutes it.
    under = WorkerView("under", prefill_backlog=14_700.0, recent_tokens=80_000.0)
    idle = WorkerView("idle", recent_tokens=120_000.0)
    assert pick([under, idle], PolicyWeights(**w), 96_000) == "under"
    assert pick([under, idle], PolicyWeights(**w, ttft_share=0.0), 96_000) == "idle"
