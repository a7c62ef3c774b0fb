"""The hybrid KV cache manager with vLLM 0.33's decisions (``kv_cache_manager.py`` and
``kv_cache_coordinator.py``): the same calls a vLLM scheduler makes --
``get_computed_blocks``, ``allocate_slots``, ``free``, ``take_events`` -- with the same
hits and the same published events, so the simulated engine is exactly as kind (or as
unkind) to a router as a real worker.

Hybrid hits are a fixed point: groups are looked up full attention first, each one
either accepts the candidate length or lowers it, until a whole pass changes nothing
(one pass for "one full + one other"). EAGLE groups look one drop unit further and drop
it. Hits are aligned to the lcm of the group block sizes, or to ``hash_block_size`` when
partial-hash hits are on (a mamba ``align`` group with blocks larger than the hash unit).
Pure Python, no torch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from offload_core.vmamba import MambaManager
from offload_core.vmanagers import GroupManager, SlidingWindowManager, cdiv
from offload_core.vpool import VBlock, VBlockPool
from offload_core.vrequest import VRequest
from schemas import BlockStored, KVEvent
from schemas.hit_rule import KIND_SLIDING, GroupSpec


def replay_boundaries(num_prompt: int, step: int, eagle: bool) -> tuple[int, ...]:
    """Where a later request replaying this prompt can resume (kept under retention)."""
    if not eagle:
        return (num_prompt - 1,)
    resend = (num_prompt - 1) // step * step
    extension = num_prompt // step * step
    return tuple(sorted({max(resend - step, 0), max(extension - step, 0)}))


def partial_hash_hits(groups: Sequence[GroupSpec], hash_block_size: int) -> bool:
    """vLLM enables sub-block hits iff some mamba group's block exceeds the hash unit."""
    return any(g.rule == "mamba" and g.block_size > hash_block_size for g in groups)


def manager_for(spec: GroupSpec, pool: VBlockPool, group_id: int, step: int) -> GroupManager:
    """The manager class vLLM picks for a group's attention type."""
    classes: dict[str, type[GroupManager]] = {
        "sliding": SlidingWindowManager,
        "mamba": MambaManager,
    }
    return classes.get(spec.rule, GroupManager)(spec, pool, group_id, step)


@dataclass(slots=True)
class _SpecGroup:
    spec: GroupSpec
    group_ids: list[int]
    manager: GroupManager
    eagle: bool


class VKVCacheManager:
    """vLLM 0.33's ``KVCacheManager`` (+ coordinator) over one ``VBlockPool``."""

    def __init__(
        self,
        groups: Sequence[GroupSpec],
        num_blocks: int,
        *,
        hash_block_size: int | None = None,
        eagle: bool = False,
        retention_interval: int | None = None,
        enable_events: bool = True,
        max_model_len: int = 1 << 30,
    ) -> None:
        if not groups:
            raise ValueError("at least one KV cache group is required")
        self.groups = list(groups)
        sizes = [g.block_size for g in self.groups]
        self.step = math.lcm(*sizes)
        if hash_block_size is None:
            hash_block_size = sizes[0] if len(sizes) == 1 else math.gcd(*sizes)
        if len(sizes) == 1 and hash_block_size != sizes[0]:
            raise ValueError("with one KV cache group, hash_block_size must equal its block size")
        if any(b % hash_block_size for b in sizes):
            raise ValueError(f"every block size must be a multiple of {hash_block_size}")
        self.hash_block_size = hash_block_size
        self.eagle = eagle
        self.max_model_len = max_model_len
        self.hybrid = len(self.groups) > 1
        self.partial_hits = self.hybrid and partial_hash_hits(self.groups, hash_block_size)
        self.alignment = hash_block_size if self.partial_hits else self.step
        if retention_interval is not None:
            sparse = any(g.rule in ("sliding", "mamba") for g in self.groups)
            if not sparse and retention_interval:
                raise ValueError("retention_interval needs a sliding-window or mamba group")
            if retention_interval < 0 or retention_interval % self.step:
                raise ValueError(f"retention_interval must be a multiple of {self.step}")
        self.retention = retention_interval
        self.pool = VBlockPool(num_blocks, hash_block_size, enable_events)
        self.managers = [manager_for(g, self.pool, i, self.step) for i, g in enumerate(groups)]
        for m in self.managers:
            m.alignment = self.alignment if self.hybrid else m.block_size
            m.use_eagle = eagle
            if isinstance(m, MambaManager):
                m.drop_eagle_checkpoint = eagle
        self.spec_groups: list[_SpecGroup] = []
        for i, (g, m) in enumerate(zip(self.groups, self.managers, strict=True)):
            for sg in self.spec_groups:
                if sg.spec == g and type(sg.manager) is type(m):
                    sg.group_ids.append(i)
                    break
            else:
                self.spec_groups.append(_SpecGroup(g, [i], m, eagle))
        self.spec_groups.sort(key=lambda sg: sg.spec.rule != "full")
        self._meta = [
            (g.kind, g.sliding_window if g.kind == KIND_SLIDING else None) for g in self.groups
        ]
        self.copies_retained: list[VBlock] = []

    # ------------------------------------------------------------------ hits
    def find_longest_cache_hit(
        self, hashes: Sequence[bytes], max_len: int
    ) -> tuple[list[list[VBlock]], int, int]:
        """(blocks per group, hit tokens, uncached shared-prefix tokens)."""
        if not self.hybrid:
            m = self.managers[0]
            blocks, hit = m.find_hit(hashes, max_len, [0], self.eagle)
            return blocks, hit, 0
        n = len(self.groups)
        unit = self.hash_block_size
        hit = max_len
        longest = 0
        by_group: list[list[VBlock] | None] = [None] * n
        len_by_group = [0] * n
        simple = len(self.spec_groups) == 2 and self.spec_groups[0].spec.rule == "full"
        verified: set[int] = set()
        while True:
            cur = hit
            for idx, sg in enumerate(self.spec_groups):
                first = sg.group_ids[0]
                if sg.spec.rule == "full" and by_group[first] is not None:
                    cur = min(cur, len_by_group[first])
                    continue
                drop = sg.eagle and idx not in verified
                limit = cur
                if drop and sg.spec.rule != "mamba":
                    b = sg.manager.block_size
                    margin = (
                        unit if (self.partial_hits and sg.manager.fine_grained and b > unit) else b
                    )
                    limit = min(cur + margin, len(hashes) * unit)
                blocks, new = sg.manager.find_hit(hashes, limit, sg.group_ids, drop)
                if drop:
                    verified.add(idx)
                elif new < cur:
                    verified.clear()
                cur = new
                for gid, blk in zip(sg.group_ids, blocks, strict=True):
                    by_group[gid] = blk
                    len_by_group[gid] = new
                longest = max(longest, cur)
            if cur >= hit:
                break
            hit = cur
            if simple:
                break
        for sg in self.spec_groups:
            if sg.spec.rule != "full":
                continue
            keep = cdiv(hit, sg.manager.block_size)
            for gid in sg.group_ids:
                got = by_group[gid]
                if got is not None:
                    del got[keep:]
        return [b if b is not None else [] for b in by_group], hit, longest - hit

    def get_computed_blocks(
        self, req: VRequest, max_hit: int | None = None
    ) -> tuple[list[list[VBlock]], int, int]:
        """What vLLM reuses for ``req``: (blocks, hit tokens, shared-prefix boundary)."""
        if req.skip_prefix_cache:
            return [[] for _ in self.groups], 0, 0
        if max_hit is None:
            max_hit = req.num_tokens - 1
        blocks, hit, uncached = self.find_longest_cache_hit(req.block_hashes, max_hit)
        if hit > 0 and req.report_full:
            for g, got in enumerate(blocks):
                if got:
                    self.pool.emit_cached(req, len(got), self.groups[g].block_size, g)
        return blocks, hit, (hit + uncached if uncached else 0)

    # ------------------------------------------------------------ allocation
    def allocate_slots(
        self,
        req: VRequest,
        num_new_tokens: int,
        num_new_computed_tokens: int = 0,
        new_computed_blocks: list[list[VBlock]] | None = None,
        num_lookahead_tokens: int = 0,
        num_external_computed_tokens: int = 0,
    ) -> bool:
        """Give ``req`` slots for ``num_new_tokens`` more tokens and key what is full;
        False (nothing changed) when the pool cannot hold them now."""
        rid = req.request_id
        if new_computed_blocks is None:
            new_computed_blocks = [[] for _ in self.groups]
        local = req.num_computed_tokens + num_new_computed_tokens
        total = min(local + num_external_computed_tokens, self.max_model_len)
        main = total + num_new_tokens
        need_slot = min(main + num_lookahead_tokens, self.max_model_len)
        for m in self.managers:
            m.remove_skipped(rid, total)
        wanted = sum(
            m.num_blocks_to_allocate(rid, need_slot, new_computed_blocks[i], total, local, main)
            for i, m in enumerate(self.managers)
        )
        if wanted > self.pool.num_free_blocks:
            return False
        running = any(rid in m.num_cached for m in self.managers)
        if not running and (any(new_computed_blocks) or num_external_computed_tokens > 0):
            for i, m in enumerate(self.managers):
                m.add_local_computed(
                    rid, new_computed_blocks[i], local, num_external_computed_tokens
                )
            if num_external_computed_tokens > 0:
                for m in self.managers:
                    m.allocate_external(rid, local, num_external_computed_tokens)
        for m in self.managers:
            m.allocate_new(rid, need_slot, main)
        self.cache_blocks(req, min(total + num_new_tokens, req.num_tokens))
        return True

    def _cacheable(self, m: GroupManager, num_tokens: int) -> int:
        if not self.hybrid:
            return num_tokens
        align = (lambda n: n) if self.partial_hits else (lambda n: n // self.step * self.step)
        cached = align(num_tokens)
        if m.use_eagle and cached > 0:
            return min(num_tokens, align(num_tokens) + m.block_size)
        return cached

    def cache_blocks(self, req: VRequest, num_tokens: int) -> None:
        bounds = replay_boundaries(req.num_prompt_tokens, self.step, self.eagle)
        for m in self.managers:
            m.cache(req, self._cacheable(m, num_tokens), self.retention, bounds)

    def free(self, req: VRequest | str) -> None:
        """Release a finished request's blocks, each group tail first."""
        rid = req if isinstance(req, str) else req.request_id
        for m in self.managers:
            m.free(rid)

    def take_copies(self) -> list[VBlock]:
        """Blocks held for this step's copy-on-write copies; ``release`` them after."""
        out = []
        for m in self.managers:
            for src, dst in m.pending_copies:
                out += [src, dst]
            m.pending_copies.clear()
        return out

    def release(self, blocks: Sequence[VBlock]) -> None:
        self.pool.free_blocks(blocks)

    def new_step_starts(self) -> None:
        for m in self.managers:
            m.new_step()

    def reset_prefix_cache(self) -> bool:
        return self.pool.reset()

    def take_events(self) -> list[KVEvent]:
        events = self.pool.take_events()
        for ev in events:
            if isinstance(ev, BlockStored) and ev.group_idx is not None:
                ev.kv_cache_spec_kind, ev.kv_cache_spec_sliding_window = self._meta[ev.group_idx]
        return events
