"""The knee in the ``capped-prefill`` and ``prefill-shaping`` profiles (round 18).

Where prefills are capped (by the engines, or by the proxy's warming) a request waits, of
each prefill ahead of it, at most what it prefills itself, so a cached turn never comes
near the knee; a request with a long prefill of its own behind a long backlog does. The
knee therefore moves only such requests: on the Mooncake trace, prompts of 10k-60k
tokens with nothing cached, which the fair-share term had sent behind 25k-150k tokens of
backlog while other workers had none (docs/routing_rounds.md, round 18)."""

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


def fleet(hit: int = 0) -> list[WorkerView]:
    """A worker prefilling a 112k-token prompt that got less than its share of recent
    tokens (cached ``hit`` tokens of the request), and an idle one that got more."""
    busy = WorkerView("busy", hit_tokens=hit, score=float(hit), inflight=4,
                      prefill_backlog=112_000.0, prefilling=(112_000.0,),
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


def test_the_profiles_knee_is_above_the_default() -> None:
    for profile in ("capped-prefill", "prefill-shaping"):
        weights = profile_weights(profile)
        assert weights.backlog_over == 0.25 and weights.knee == 32_768
        assert dataclasses.replace(weights, backlog_over=0.0) == profile_weights(
            profile, {"backlog_over": 0}
        )
