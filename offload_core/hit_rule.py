"""The hybrid (HMA) prefix-cache hit rule, shared by the engine and the router.

A hit of ``p`` tokens is possible iff ``p <= request_tokens - 1``, ``p`` is a multiple of
the lcm of every group's block size, and *every* group accepts ``p``:

* full attention (and MLA): every block ending at b, 2b, ..., p is cached;
* sliding window W: the last ``max(1, ceil((W - 1) / b))`` blocks ending at p are cached
  (all blocks up to p when p is shorter than that);
* mamba: a state block ends exactly at p.

The answer is the largest such ``p`` -- not the minimum of per-group maxima: an old
sliding-window block that was evicted costs nothing, a hole inside the window pulls ``p``
back to the last position whose window is intact. Pure Python, no torch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

KIND_FULL = "full_attention"
KIND_SLIDING = "sliding_window"
KIND_MAMBA = "mamba"
# Kinds that need every block of the prefix, like full attention.
FULL_KINDS = frozenset({KIND_FULL, "mla_attention", "full", "mla", "cross_attention"})
SLIDING_KINDS = frozenset({KIND_SLIDING, "swa", "sliding_window_mla"})
MAMBA_KINDS = frozenset({KIND_MAMBA})


@dataclass(frozen=True, slots=True)
class GroupSpec:
    """What the hit rule needs to know about one KV cache group."""

    kind: str = KIND_FULL
    block_size: int = 16
    sliding_window: int | None = None

    @property
    def rule(self) -> str:
        """``"full"``, ``"sliding"`` or ``"mamba"``; unknown kinds count as full (strictest)."""
        if self.kind in SLIDING_KINDS and self.sliding_window:
            return "sliding"
        if self.kind in MAMBA_KINDS:
            return "mamba"
        return "full"

    @property
    def window_blocks(self) -> int:
        """Blocks a sliding-window group needs ending at the hit position."""
        if self.rule != "sliding":
            return 0
        assert self.sliding_window is not None
        return max(1, math.ceil((self.sliding_window - 1) / self.block_size))


def hit_step(groups: Sequence[GroupSpec]) -> int:
    """The granularity of a hit: lcm of the groups' block sizes."""
    return math.lcm(*(g.block_size for g in groups)) if groups else 1


def max_candidate(request_tokens: int, step: int) -> int:
    """The largest aligned hit allowed by the ``request_tokens - 1`` cap."""
    if request_tokens <= 1:
        return 0
    return ((request_tokens - 1) // step) * step


class GroupAcceptor:
    """Answers "does this group accept a hit ending at block ``e``?" in O(1).

    ``cached[i]`` says whether the group's block ``i`` (tokens ``[i*b, (i+1)*b)``) is
    cached. Built once per (request, worker, group) in O(len(cached)).
    """

    __slots__ = ("_cached", "_prefix", "_rule", "_runs", "_window")

    def __init__(self, spec: GroupSpec, cached: Sequence[bool]) -> None:
        self._rule = spec.rule
        self._cached = cached
        self._window = spec.window_blocks
        if self._rule == "full":
            prefix = 0
            for hit in cached:
                if not hit:
                    break
                prefix += 1
            self._prefix = prefix
        elif self._rule == "sliding":
            # runs[e] = length of the run of cached blocks ending just before block e.
            runs = [0] * (len(cached) + 1)
            for i, hit in enumerate(cached):
                runs[i + 1] = runs[i] + 1 if hit else 0
            self._runs = runs

    def accepts(self, end_block: int) -> bool:
        """True when a hit covering blocks ``[0, end_block)`` is usable by this group."""
        if end_block <= 0:
            return True
        if end_block > len(self._cached):
            return False
        if self._rule == "full":
            return end_block <= self._prefix
        if self._rule == "sliding":
            return self._runs[end_block] >= min(self._window, end_block)
        return bool(self._cached[end_block - 1])


def group_max_hit(spec: GroupSpec, cached: Sequence[bool], limit: int, step: int) -> int:
    """This group's own largest acceptable hit (per-group detail; not the answer)."""
    acceptor = GroupAcceptor(spec, cached)
    p = limit
    while p > 0 and not acceptor.accepts(p // spec.block_size):
        p -= step
    return max(p, 0)


def longest_hit(
    request_tokens: int,
    groups: Sequence[GroupSpec],
    cached: Sequence[Sequence[bool]],
) -> int:
    """Largest ``p`` (tokens) that every group accepts, per the rule above.

    ``cached[g][i]`` tells whether block ``i`` of group ``g`` is cached; lists may be
    shorter than the request (missing blocks are misses).
    """
    if not groups:
        return 0
    step = hit_step(groups)
    acceptors = [GroupAcceptor(g, c) for g, c in zip(groups, cached, strict=True)]
    p = max_candidate(request_tokens, step)
    while p > 0:
        if all(a.accepts(p // g.block_size) for a, g in zip(acceptors, groups, strict=True)):
            return p
        p -= step
    return 0
