"""The hybrid (HMA) prefix-cache hit rule, shared by the engine and the router.

A hit of ``p`` tokens is possible iff ``p <= request_tokens - 1``, ``p`` is a multiple of
the lcm of every group's block size, and *every* group accepts ``p``:

* full attention (and MLA): every block ending at b, 2b, ..., p is cached;
* sliding window W: the last ``max(1, ceil((W - 1) / b))`` blocks ending at p are cached
  (all blocks up to p when p is shorter than that);
* mamba: a state block ends exactly at p;
* full attention with partial-hash hits (``block_units`` k > 1: the group's blocks are
  k hash units, indexed per unit -- a block's entry at its last unit, partial entries at
  the others): ``p`` up to ``F``, where ``F`` extends the run of leading cached blocks
  (at most the request's cap allows) into the next block up to its highest partial
  entry below that block's end and the cap (vLLM's fine-grained lookup); a block's KV is
  append-only, so every shorter hit is served too.

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
    # Hash units per engine block when a full-attention group is indexed per unit
    # (partial-hash hits); ``block_size`` is then the unit.
    block_units: int = 1

    @property
    def rule(self) -> str:
        """``"full"``, ``"sliding"``, ``"mamba"`` or ``"fine"`` (full attention indexed per
        hash unit with partial entries); unknown kinds count as full (strictest)."""
        if self.kind in SLIDING_KINDS and self.sliding_window:
            return "sliding"
        if self.kind in MAMBA_KINDS:
            return "mamba"
        if self.block_units > 1:
            return "fine"
        return "full"

    @property
    def window_blocks(self) -> int:
        """Blocks a sliding-window group needs ending at the hit position."""
        if self.rule != "sliding":
            return 0
        assert self.sliding_window is not None
        return max(1, math.ceil((self.sliding_window - 1) / self.block_size))


def fine_reach(mask: bytes, k: int, cap_units: int) -> int:
    """Units a fine-grained full-attention group serves (vLLM 0.33's
    ``FullAttentionManager.find_longest_cache_hit`` with partial-hash hits): the leading
    blocks whose entry (at unit ``(i+1)k - 1``) is cached, at most ``cap_units // k`` of
    them, then the highest partial entry inside the next block below its last unit and
    below ``cap_units`` (a block entry there is never probed)."""
    blocks = 0
    limit = min(cap_units, len(mask)) // k
    while blocks < limit and mask[blocks * k + k - 1]:
        blocks += 1
    start = blocks * k
    top = min(start + k - 1, cap_units, len(mask))
    last = mask.translate(_INVERT).rfind(0, start, top) if top > start else -1
    return last + 1 if last >= 0 else start


def hit_step(groups: Sequence[GroupSpec]) -> int:
    """The granularity of a hit: lcm of the groups' block sizes."""
    return math.lcm(*(g.block_size for g in groups)) if groups else 1


def max_candidate(request_tokens: int, step: int) -> int:
    """The largest aligned hit allowed by the ``request_tokens - 1`` cap."""
    if request_tokens <= 1:
        return 0
    return ((request_tokens - 1) // step) * step


# bytes.translate table: cached (non-zero) -> 0, missing (zero) -> 1.
_INVERT = bytes([1] + [0] * 255)


def as_mask(cached: Sequence[bool] | bytes | bytearray) -> bytes:
    """``cached`` as bytes (non-zero = cached), so scans run in C (``find``/``rfind``)."""
    if isinstance(cached, bytes):
        return cached
    if isinstance(cached, bytearray):
        return bytes(cached)
    return bytes(map(bool, cached))


class GroupAcceptor:
    """Answers "does this group accept a hit ending at block ``e``?" and jumps to the
    next acceptable position below a rejected one.

    ``cached[i]`` says whether the group's block ``i`` (tokens ``[i*b, (i+1)*b)``) is
    cached: bools, or bytes where non-zero means cached (the router passes tier bitmasks).
    Every check is a C-level bytes scan, so building an acceptor costs no Python loop --
    the scorer builds one per (request, worker, group, tier).
    """

    __slots__ = ("_b", "_hits", "_mask", "_prefix", "_rule", "_window")

    def __init__(
        self,
        spec: GroupSpec,
        cached: Sequence[bool] | bytes | bytearray,
        cap: int | None = None,
    ) -> None:
        """``cap``: the request's longest possible hit in tokens (``request_tokens - 1``);
        only the ``"fine"`` rule needs it (vLLM probes partial entries below it)."""
        self._rule = spec.rule
        self._b = spec.block_size
        self._mask = mask = as_mask(cached)
        self._window = spec.window_blocks
        self._hits: bytes | None = None
        if self._rule == "full":
            first_miss = mask.find(0)
            self._prefix = len(mask) if first_miss < 0 else first_miss
        elif self._rule == "fine":
            # ``_prefix``: units the group serves (``F`` in the module doc); the rule is
            # then full attention at the unit.
            self._prefix = fine_reach(
                mask, spec.block_units, len(mask) if cap is None else cap // self._b
            )
            self._rule = "full"

    def accepts(self, end_block: int) -> bool:
        """True when a hit covering blocks ``[0, end_block)`` is usable by this group."""
        if end_block <= 0:
            return True
        mask = self._mask
        if end_block > len(mask):
            return False
        if self._rule == "full":
            return end_block <= self._prefix
        if self._rule == "sliding":
            return mask.rfind(0, max(0, end_block - self._window), end_block) < 0
        return mask[end_block - 1] != 0

    def _last_hit_before(self, end: int) -> int:
        """Index of the last cached block below ``end`` (-1 when none): the zero bytes
        of the inverted mask, found with one C-level ``rfind``."""
        if self._hits is None:
            self._hits = self._mask.translate(_INVERT)
        return self._hits.rfind(0, 0, end)

    def floor(self, p: int, step: int) -> int:
        """The largest ``p' <= p`` (a multiple of ``step``) this group accepts.

        ``p`` must be a multiple of ``step``, itself a multiple of the block size. Each
        rejected position jumps past the miss that caused it, so a descent costs one
        scan per miss met, not one per candidate.
        """
        b, mask = self._b, self._mask
        if self._rule == "full":
            return min(p, (self._prefix * b) // step * step)
        while p > 0:
            end = min(p // b, len(mask))
            if end < p // b:  # beyond the known blocks: fall back to the last known one
                p = end * b // step * step
                continue
            if self._rule == "sliding":
                miss = mask.rfind(0, max(0, end - self._window), end)
                if miss < 0:
                    return p
                # A window ending at e' <= miss needs block e'-1 cached, so jump to just
                # after the last cached block below the miss.
                p = (self._last_hit_before(miss) + 1) * b // step * step
            else:
                if mask[end - 1]:
                    return p
                p = (self._last_hit_before(end) + 1) * b // step * step
        return 0


def group_max_hit(
    spec: GroupSpec, cached: Sequence[bool] | bytes | bytearray, limit: int, step: int
) -> int:
    """This group's own largest acceptable hit (per-group detail; not the answer).
    ``limit`` is also the cap of a ``"fine"`` group: exact when it is the request's cap
    or the end of ``cached`` below it (nothing past the end is cached)."""
    return GroupAcceptor(spec, cached, limit).floor(max(limit, 0) // step * step, step)


def longest_hit(
    request_tokens: int,
    groups: Sequence[GroupSpec],
    cached: Sequence[Sequence[bool] | bytes | bytearray],
    *,
    eagle: bool = False,
    alignment: int | None = None,
    hash_block_size: int | None = None,
) -> int:
    """Largest ``p`` (tokens) that every group accepts, per the rule above.

    ``cached[g][i]`` tells whether block ``i`` of group ``g`` is cached (bools, or bytes
    with non-zero = cached); lists may be shorter than the request (missing blocks are
    misses). Each group's ``floor`` never drops below the answer, so lowering ``p`` to
    every group's floor until none moves it reaches exactly the largest common ``p``.

    Keyword settings (defaults = the plain rule):

    * ``alignment``: hit granularity in tokens (default: the lcm of the block sizes); it
      must be a multiple of every block size (partial-hash hits index their groups per
      hash unit instead: ``GroupSpec.block_units``, rule ``"fine"``);
    * ``eagle``: vLLM's EAGLE last-block drop -- a full-attention or sliding-window
      group accepts ``p`` only if it would accept ``p + block_size`` with one more
      window block (the "peek" block past the hit is cached too), and that block lies
      within the request: ``p + b <= request_tokens - 1`` with one group, ``p + b <=``
      the request's whole hash units with several (``hash_block_size``, default the gcd
      of the block sizes). Mamba groups are unchanged.
    """
    if not groups:
        return 0
    step = alignment or hit_step(groups)
    if any(step % g.block_size for g in groups):
        raise ValueError(f"alignment {step} is not a multiple of every group's block size")
    if not eagle:
        cap = request_tokens - 1
        acceptors = [GroupAcceptor(g, c, cap) for g, c in zip(groups, cached, strict=True)]
        p = max_candidate(request_tokens, step)
        while p > 0:
            lowest = p
            for acceptor in acceptors:
                lowest = acceptor.floor(lowest, step)
            if lowest == p:
                return p
            p = lowest
        return 0
    return _eagle_hit(request_tokens, groups, cached, step, hash_block_size)


def _eagle_hit(
    request_tokens: int,
    groups: Sequence[GroupSpec],
    cached: Sequence[Sequence[bool] | bytes | bytearray],
    step: int,
    hash_block_size: int | None,
) -> int:
    """The EAGLE rule as a descending scan over aligned candidates (one check each)."""
    if len(groups) == 1:
        limit = request_tokens - 1
    else:
        unit = hash_block_size or math.gcd(*(g.block_size for g in groups))
        limit = request_tokens // unit * unit
    checks = []
    for g, c in zip(groups, cached, strict=True):
        if g.rule == "mamba":
            checks.append((GroupAcceptor(g, c), 0))
            continue
        wider = g
        if g.rule == "sliding":
            assert g.sliding_window is not None
            wider = GroupSpec(g.kind, g.block_size, g.sliding_window + g.block_size)
        checks.append((GroupAcceptor(wider, c), g.block_size))
    p = max_candidate(request_tokens, step)
    while p > 0:
        if all(
            (peek == 0 and a.accepts(p // a._b))
            or (peek and p + peek <= limit and a.accepts(p // peek + 1))
            for a, peek in checks
        ):
            return p
        p -= step
    return 0
