"""Pluggable eviction policies for the CPU tier, selectable by name."""

from __future__ import annotations

from offload_core.cpu.policies.arc import ARCPolicy
from offload_core.cpu.policies.base import CanEvict, EvictionPolicy
from offload_core.cpu.policies.lru import LRUPolicy

POLICIES: dict[str, type[EvictionPolicy]] = {"lru": LRUPolicy, "arc": ARCPolicy}


def make_policy(name: str, capacity: int) -> EvictionPolicy:
    """Build the policy called ``name`` (``"lru"`` or ``"arc"``)."""
    try:
        cls = POLICIES[name.lower()]
    except KeyError:
        raise ValueError(
            f"unknown eviction policy {name!r}; expected one of {sorted(POLICIES)}"
        ) from None
    return cls(capacity)


__all__ = ["POLICIES", "ARCPolicy", "CanEvict", "EvictionPolicy", "LRUPolicy", "make_policy"]
