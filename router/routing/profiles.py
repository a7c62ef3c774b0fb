"""Route profiles: named, measured ``kv_aware`` weight sets for the fleets they were
measured on.

Why: which weights win depends on how the engines schedule prefill (vLLM's default
chunked prefill serves a long prompt before anything queued behind it; engines started
with ``--long-prefill-token-threshold`` interleave) and on whether the router's proxy
sends requests itself (prefix warming). The routing grid (docs/routing.md) measured one
setting per such fleet; a profile names it so an operator picks the fleet, not a string of
knobs. ``route_weights`` still apply on top (e.g. ``prefill_cap`` set to the engines' own
threshold), and ``default`` is the weights' own defaults.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from router.routing.base import PolicyWeights
from router.routing.policy import policy_weights

DEFAULT_PROFILE = "default"


# What each profile is for, and what it measured, is in docs/routing.md (route profiles),
# whose table a test checks against these weights.
ROUTE_PROFILES: Mapping[str, Mapping[str, float]] = MappingProxyType(
    {
        # vLLM engines as shipped (uncapped chunked prefill), any client.
        DEFAULT_PROFILE: MappingProxyType({}),
        # vLLM engines as shipped, where prefix hits matter more than the TTFT tail.
        "hits-first": MappingProxyType({"prefill_large": 2.0}),
        # vLLM engines as shipped behind kvroute's OpenAI proxy, which sends the
        # prefix-warming requests (/v1/route callers send ``warm_prefixes`` themselves).
        "prefill-shaping": MappingProxyType(
            {
                "warm_chunk": 8192.0,
                "backlog_large": 0.06,
                "warm_cached": 0.5,
                "backlog_over": 0.25,
                "knee": 32768.0,
            }
        ),
        # Chat fleets whose engines each hold only a few conversations' context: the
        # conversations served at once are spread evenly (each request in flight weighs
        # 200 tokens), so none crowds onto an engine that then evicts them all.
        "few-sessions": MappingProxyType({"decode": 200.0}),
        # Engines started with --long-prefill-token-threshold 4096 (set the prefill_cap
        # route weight to the engines' own threshold).
        "capped-prefill": MappingProxyType(
            {
                "prefill_cap": 4096.0,
                "backlog_large": 0.06,
                "prefill_large": 1.5,
                "backlog_over": 1.0,  # past the default knee, 16,384 tokens (round 19)
            }
        ),
    }
)
PROFILE_NAMES: tuple[str, ...] = tuple(ROUTE_PROFILES)


def check_profile(name: str) -> str:
    """``name`` if it names a profile, else ``ValueError`` listing them."""
    if name not in ROUTE_PROFILES:
        raise ValueError(f"unknown route profile {name!r}; expected one of {list(PROFILE_NAMES)}")
    return name


def profile_weights(
    name: str = DEFAULT_PROFILE, overrides: Mapping[str, object] | None = None
) -> PolicyWeights:
    """The profile's weights with ``overrides`` on top (an override wins); ``ValueError``
    for an unknown profile or weight."""
    merged: dict[str, object] = {**ROUTE_PROFILES[check_profile(name)]}
    merged.update(overrides or {})
    return policy_weights(merged)
