"""The knee in the ``capped-prefill`` and ``prefill-shaping`` profiles (rounds 18, 19).

Where prefills are capped (by the engines, or by the proxy's warming) a request waits, of
each prefill ahead of it, at most what it prefills itself, so a cached turn never comes
near the knee; a request with a long prefill of its own behind a long backlog does. The
knee therefore moves only such requests: on the Mooncake trace, prompts of 10k-60k
tokens with nothing cached, which the fair-share term had sent behind 25k-150k tokens of
backlog while other workers had none (docs/routing_rounds.md, round 18). Round 19 moved
``capped-prefill``'s knee from 32,768 tokens at 0.25 to 16,384 at 1: the same kind of
prompt behind 20k-35k tokens of backlog, under the old knee, still set the p99."""

from __future__ import annotations

import dataclasses
import random

from router.routing.policy import RouteInput, WorkerView, make_policy
from router.routing.profiles import profile_weights

# A warm router at load 0.9: 32 workers' worth of requests routed, the fleet a quarter idle.
ROUTED = 32 * 64


def pick(views: list[WorkerView], profile: str, n: int, **overrides: float) -> str:
    weights = profile_weights(profile, overrides)
    request = RouteInput(n, routed=ROUTED, idle=0.25)
    choice = make_policy("kv_aware").choose(request, views, weights, random.Random(0))
    return views[choice.index].worker_id


def fleet(hit: int = 0, backlog: float = 112_000.0) -> list[WorkerView]:
    """A worker prefilling a ``backlog``-token prompt that got less than its share of
    recent tokens (cached ``hit`` tokens of the request), and an idle one that got more."""
    busy = WorkerView("busy", hit_tokens=hit, score=float(hit), inflight=4,
                      prefill_backlog=backlog, prefilling=(backlog,),
                      inflight_tokens=500_000.0, recent_tokens=600_000.0)  # fmt: skip
    idle = WorkerView("idle", inflight=4, inflight_tokens=500_000.0, recent_tokens=700_000.0)
    return [busy, idle]


def test_a_long_new_prompt_leaves_a_long_backlog_with_the_knee() -> None:
    for profile in ("capped-prefill", "prefill-shaping"):
        assert pick(fleet(), profile, 58_000, backlog_over=0.0) == "busy", profile
        assert pick(fleet(), profile, 58_000) == "idle", profile


def test_a_cached_turn_stays_behind_the_same_backlog() -> None:
    # 12k tokens, 10k cached: it waits at most one chunk of the prefill ahead, under the knee.
    for profile in ("capped-prefill", "prefill-shaping"):
        assert pick(fleet(hit=10_000), profile, 12_000) == "busy", profile
    # Where prefills are not capped it waits for all 112k, past the knee: it would move.
    assert pick(fleet(hit=10_000), "capped-prefill", 12_000, prefill_cap=0) == "idle"


def test_on_capped_engines_a_shorter_backlog_repels_a_long_new_prompt_too() -> None:
    # Round 19: a 58k-token new prompt behind 29k tokens of backlog, under round 18's
    # knee of 32,768, stayed (the fair-share term outweighed 0.06 x 29k); past 16,384 at
    # full weight it goes to the idle worker.
    short = fleet(backlog=29_000.0)
    assert pick(short, "capped-prefill", 58_000, backlog_over=0.25, knee=32_768) == "busy"
    assert pick(short, "capped-prefill", 58_000) == "idle"
    # A cached turn behind two such prompts waits a chunk of each: under the knee.
    two = [dataclasses.replace(short[0], hit_tokens=10_000, score=10_000.0,
                               prefill_backlog=58_000.0, prefilling=(29_000.0, 29_000.0)),
           short[1]]  # fmt: skip
    assert pick(two, "capped-prefill", 12_000) == "busy"


def test_the_profiles_knees() -> None:
    knees = {"capped-prefill": (1.0, 16_384), "prefill-shaping": (0.25, 32_768)}
    for profile, (over, knee) in knees.items():
        weights = profile_weights(profile)
        assert (weights.backlog_over, weights.knee) == (over, knee)
        assert dataclasses.replace(weights, backlog_over=0.0) == profile_weights(
            profile, {"backlog_over": 0}
        )
