"""Scheduler-side lookups against an ``OffloadingManager``, per docs/design.md#hit-rule.

The manager answers one block at a time (True, False, or None for "not known yet"); the
functions here turn those answers into how many leading tokens of a request the offloaded
tier can supply, per group and for a whole hybrid model. A None that the answer depends
on makes the whole lookup None: the scheduler defers the request and asks again later.

Semantics match ``schemas.hit_rule`` exactly (the tests compare them on random
cases); this module only adds the incremental, per-block querying.

Why it has no caller in the simulated engine: its CPU tier answers synchronously, so the
engine applies the mask form of the rule (``schemas.hit_rule.longest_hit`` over GPU or
CPU blocks) in one pass. This module is the library form for tiers that answer later —
vLLM 0.33's ``OffloadingManager.lookup`` returns ``RETRY`` / ``HIT_PENDING`` for those,
and its offloading scheduler then defers the request — which is what an integrator
plugging a remote or disk tier into ``offload_core`` needs.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol

from offload_core.base import OffloadingManager, OffloadKey, ReqContext, make_offload_key
from schemas.hit_rule import GroupSpec, hit_step, max_candidate


class SupportsLookup(Protocol):
    """The one method these functions need (any ``OffloadingManager`` has it)."""

    def lookup(self, key: OffloadKey, ctx: ReqContext) -> bool | None: ...


def lookup_prefix(
    manager: SupportsLookup, keys: Sequence[OffloadKey], ctx: ReqContext
) -> int | None:
    """Full attention: the number of consecutive hits from block 0.

    Stops at the first miss; a None met before it makes the result None.
    """
    count = 0
    for key in keys:
        hit = manager.lookup(key, ctx)
        if hit is None:
            return None
        if not hit:
            break
        count += 1
    return count


def lookup_sliding_window(
    manager: SupportsLookup,
    keys: Sequence[OffloadKey],
    window_blocks: int,
    ctx: ReqContext,
) -> int | None:
    """Sliding window: the largest end ``e`` (in blocks) whose window is intact.

    ``e`` is accepted when blocks ``[e - window_blocks, e)`` are all hits, or when
    ``e < window_blocks`` and blocks ``[0, e)`` are. Scans from the right, so blocks that
    fell out of the window long ago are never asked about; returns None when a block
    the answer depends on is not known yet.
    """
    window = max(1, window_blocks)
    end = len(keys)  # candidate end: the run of hits ending here is being measured
    i = end - 1
    while i >= 0:
        if end - (i + 1) >= window:
            return end
        hit = manager.lookup(keys[i], ctx)
        if hit is None:
            return None
        if not hit:
            end = i
        i -= 1
    return end  # the run reaches block 0


def lookup_mamba(
    manager: SupportsLookup, keys: Sequence[OffloadKey], ctx: ReqContext
) -> int | None:
    """Mamba: the largest end ``e`` such that a state block ends there (block ``e-1`` hit)."""
    for i in range(len(keys) - 1, -1, -1):
        hit = manager.lookup(keys[i], ctx)
        if hit is None:
            return None
        if hit:
            return i + 1
    return 0


def lookup_group(
    spec: GroupSpec,
    manager: SupportsLookup,
    keys: Sequence[OffloadKey],
    ctx: ReqContext,
) -> int | None:
    """This group's largest acceptable end (blocks) within ``keys``; None = defer."""
    rule = spec.rule
    if rule == "sliding":
        return lookup_sliding_window(manager, keys, spec.window_blocks, ctx)
    if rule == "mamba":
        return lookup_mamba(manager, keys, ctx)
    return lookup_prefix(manager, keys, ctx)


class _MemoManager:
    """Caches definite answers so the fixed-point search asks each block at most once."""

    __slots__ = ("_answers", "_inner")

    def __init__(self, inner: SupportsLookup) -> None:
        self._inner = inner
        self._answers: dict[OffloadKey, bool] = {}

    def lookup(self, key: OffloadKey, ctx: ReqContext) -> bool | None:
        answer = self._answers.get(key)
        if answer is None:
            answer = self._inner.lookup(key, ctx)
            if answer is not None:
                self._answers[key] = answer
        return answer


def lookup_longest_hit(
    manager: SupportsLookup,
    request_tokens: int,
    specs: Sequence[GroupSpec],
    keys: Sequence[Sequence[OffloadKey]],
    ctx: ReqContext,
) -> int | None:
    """The largest hit ``p`` (tokens) every group accepts; None = defer the request.

    Each group proposes its largest acceptable end at or below the current ``p``; ``p``
    drops to the smallest proposal (aligned to the lcm step) until no group lowers it.
    Every proposal stays >= the true answer, so the fixed point is exactly it -- unlike
    the minimum of independent per-group maxima.
    """
    if not specs:
        return 0
    step = hit_step(specs)
    memo = _MemoManager(manager)
    p = max_candidate(request_tokens, step)
    while p > 0:
        lowered = p
        for spec, group_keys in zip(specs, keys, strict=True):
            limit = lowered // spec.block_size
            end = lookup_group(spec, memo, group_keys[:limit], ctx)
            if end is None:
                return None
            lowered = min(lowered, (end * spec.block_size) // step * step)
        if lowered == p:
            return p
        p = lowered
    return 0


class GroupRequestState:
    """One KV cache group of one request: its offload keys and its GPU block ids."""

    __slots__ = ("block_ids", "group_idx", "keys", "spec")

    def __init__(self, group_idx: int, spec: GroupSpec) -> None:
        self.group_idx = group_idx
        self.spec = spec
        self.keys: list[OffloadKey] = []
        self.block_ids: list[int] = []

    def add_block_hashes(self, block_hashes: Iterable[bytes]) -> None:
        """Append the keys of the request's next full blocks in this group."""
        group_idx = self.group_idx
        self.keys.extend(make_offload_key(h, group_idx) for h in block_hashes)

    def window_start(self, end_block: int) -> int:
        """First block this group still needs for a hit ending at ``end_block``."""
        rule = self.spec.rule
        if rule == "sliding":
            return max(0, end_block - self.spec.window_blocks)
        if rule == "mamba":
            return max(0, end_block - 1)
        return 0

    def needed_range(self, end_tokens: int, start_tokens: int = 0) -> range:
        """Block indices needed for a hit of ``end_tokens`` and not covered by the first
        ``start_tokens`` (e.g. what must be loaded beyond a GPU hit)."""
        b = self.spec.block_size
        end = min(end_tokens // b, len(self.keys))
        start = max(self.window_start(end), start_tokens // b)
        return range(start, max(start, end))


class RequestOffloadState:
    """Per-request offloading state: one ``GroupRequestState`` per KV cache group."""

    __slots__ = ("ctx", "groups", "req_id")

    def __init__(
        self, req_id: str, specs: Sequence[GroupSpec], ctx: ReqContext | None = None
    ) -> None:
        self.req_id = req_id
        self.ctx = ctx if ctx is not None else ReqContext()
        self.groups = [GroupRequestState(i, spec) for i, spec in enumerate(specs)]

    @property
    def specs(self) -> list[GroupSpec]:
        return [group.spec for group in self.groups]

    def lookup(self, manager: SupportsLookup, request_tokens: int) -> int | None:
        """Longest offloaded hit for this request (tokens); None = defer."""
        return lookup_longest_hit(
            manager,
            request_tokens,
            self.specs,
            [group.keys for group in self.groups],
            self.ctx,
        )

    def needed_keys(self, end_tokens: int, start_tokens: int = 0) -> list[OffloadKey]:
        """Keys of every group needed for a hit of ``end_tokens`` beyond ``start_tokens``."""
        out: list[OffloadKey] = []
        for group in self.groups:
            rng = group.needed_range(end_tokens, start_tokens)
            out.extend(group.keys[rng.start : rng.stop])
        return out

    def touch(self, manager: OffloadingManager, num_tokens: int) -> None:
        """Record a use of the blocks a hit of ``num_tokens`` relies on.

        Blocks already outside a group's window (old sliding-window blocks, old mamba
        states) are skipped: they will not be needed again, so refreshing them would
        only keep dead blocks in the cache.
        """
        keys = self.needed_keys(num_tokens)
        if keys:
            manager.touch(keys, self.ctx)
