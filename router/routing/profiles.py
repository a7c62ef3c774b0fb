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
from dataclasses import dataclass
from types import MappingProxyType

from router.routing.base import PolicyWeights
from router.routing.policy import policy_weights

DEFAULT_PROFILE = "default"


@dataclass(frozen=True, slots=True)
class RouteProfile:
    """A named weight set, the fleet it is for, and what it measured (held out)."""

    name: str
    weights: Mapping[str, float]
    fleet: str
    measured: str
    doc: str = "docs/routing.md#route-profiles-which-weights-for-which-fleet"


_PROFILES: tuple[RouteProfile, ...] = (
    RouteProfile(
        name=DEFAULT_PROFILE,
        weights={},
        fleet="vLLM engines as shipped (uncapped chunked prefill), any client",
        measured="Mooncake 4/12 cells on the mean of three perturbed runs, synthetic 24/24; "
        "TTFT p50 at or under every anchor's in 35/36 cells",
    ),
    RouteProfile(
        name="hits-first",
        weights={"prefill_large": 2.0},
        fleet="vLLM engines as shipped, where prefix hits (GPU time saved) matter more "
        "than the TTFT tail at moderate load",
        measured="Mooncake hit rate at or above every anchor's in 12/12 cells on the mean "
        "(11/12 in every run); TTFT p99 15-45% above Dynamo's at load 0.5",
    ),
    RouteProfile(
        name="prefill-shaping",
        weights={
            "warm_chunk": 8192.0,
            "backlog_large": 0.06,
            "warm_cached": 0.5,
            "backlog_over": 0.25,
            "knee": 32768.0,
        },
        fleet="vLLM engines as shipped, behind kvroute's OpenAI proxy (it sends the "
        "prefix-warming requests; /v1/route callers must send warm_prefixes themselves)",
        measured="Mooncake 9/12 cells on the mean of three perturbed runs, 7/12 in every run "
        "(default 4/12), synthetic 24/24",
    ),
    RouteProfile(
        name="capped-prefill",
        weights={
            "prefill_cap": 4096.0,
            "backlog_large": 0.06,
            "prefill_large": 1.5,
            "backlog_over": 0.25,
            "knee": 32768.0,
        },
        fleet="engines started with --long-prefill-token-threshold 4096 (set the "
        "prefill_cap route weight to your engines' threshold)",
        measured="Mooncake 10/12 cells on the mean of three perturbed runs (9, 9, 11 in "
        "single runs), hit rate ahead in 12/12 in every run; synthetic 24/24",
    ),
)

ROUTE_PROFILES: Mapping[str, RouteProfile] = MappingProxyType({p.name: p for p in _PROFILES})
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
    merged: dict[str, object] = {**ROUTE_PROFILES[check_profile(name)].weights}
    merged.update(overrides or {})
    return policy_weights(merged)
