"""The hybrid (HMA) hit rule, for the engine side.

The implementation lives in ``schemas.hit_rule``: the engine and the router share it, and
neither owns it. This module keeps the engine's import path.
"""

from schemas.hit_rule import (
    FULL_KINDS,
    KIND_FULL,
    KIND_MAMBA,
    KIND_SLIDING,
    MAMBA_KINDS,
    SLIDING_KINDS,
    GroupAcceptor,
    GroupSpec,
    as_mask,
    group_max_hit,
    hit_step,
    longest_hit,
    max_candidate,
)

__all__ = [
    "FULL_KINDS",
    "KIND_FULL",
    "KIND_MAMBA",
    "KIND_SLIDING",
    "MAMBA_KINDS",
    "SLIDING_KINDS",
    "GroupAcceptor",
    "GroupSpec",
    "as_mask",
    "group_max_hit",
    "hit_step",
    "longest_hit",
    "max_candidate",
]
