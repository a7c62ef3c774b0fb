"""The mamba (``align`` mode) group manager with vLLM 0.33's rules.

A hit is the last cached state at or below the candidate; a prefill keeps a state per
reachable boundary (every block by default, sparse under a retention interval) and, with
partial-hash hits, the prompt's last hash-unit boundary as a partial entry whose block is
copied on write when a later request resumes from it. Pure Python, no torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from offload_core.vmanagers import GroupManager, cdiv, mamba_checkpoint_position
from offload_core.vpool import VBlock, VBlockPool
from schemas.hit_rule import GroupSpec

if TYPE_CHECKING:
    from offload_core.vrequest import VRequest


class MambaManager(GroupManager):
    """Mamba in ``align`` mode: one state block per reachable boundary is kept."""

    def __init__(self, spec: GroupSpec, pool: VBlockPool, group_id: int, step: int) -> None:
        super().__init__(spec, pool, group_id, step)
        self.drop_eagle_checkpoint = False
        self.cached_this_step: set[bytes] = set()
        self.last_state_idx: dict[str, int] = {}
        self.retired: dict[str, int] = {}
        self.allocated: set[str] = set()

    def find_hit(
        self, hashes: Sequence[bytes], max_len: int, groups: list[int], drop_eagle: bool
    ) -> tuple[list[list[VBlock]], int]:
        pool, b, align = self.pool, self.block_size, self.alignment
        null = pool.null_block
        out: list[list[VBlock]] = [[] for _ in groups]
        if align < b and b % align == 0:
            scale = b // align
            for fine in range(min(max_len // align, len(hashes)) - 1, -1, -1):
                got = pool.get_cached_block(hashes[fine], groups)
                if got:
                    for lst, blk in zip(out, got, strict=True):
                        lst += [null] * (fine // scale) + [blk]
                    return out, (fine + 1) * align
            return out, 0
        view = pool._view(hashes, b)
        for i in range(max_len // b - 1, -1, -1):
            got = pool.get_cached_block(view[i], groups)
            if not got:
                continue
            if b != align and (i + 1) * b % align != 0:
                continue
            for lst, blk in zip(out, got, strict=True):
                lst += [null] * i + [blk]
            return out, (i + 1) * b
        return out, 0

    def mask(
        self, start: int, end: int, retention: int | None, boundaries: Sequence[int]
    ) -> list[bool] | None:
        if retention is None:
            return None
        b, align = self.block_size, self.alignment
        out = [False] * (end - start)
        if retention:
            per = retention // b
            if per <= 1:
                return None
            first = (start + per) // per * per - 1
            for i in range(first - start, len(out), per):
                out[i] = True
        for tokens in boundaries:
            idx = tokens // align * align // b - 1
            if start <= idx < end:
                out[idx - start] = True
        return out

    def skipped(self, num_computed: int) -> int:
        return num_computed - 1

    def _remove_range(self, rid: str, first: int, last: int) -> None:
        blocks = self.req_blocks.get(rid, [])
        first = max(first, self.retired.get(rid, 0))
        last = min(last, len(blocks))
        if first >= last:
            return
        freed = []
        for i in range(last - 1, first - 1, -1):
            if blocks[i].is_null:
                continue
            freed.append(blocks[i])
            blocks[i] = self.pool.null_block
        if freed:
            self.pool.free_blocks(freed)
        self.retired[rid] = last

    def remove_skipped(self, rid: str, processed: int) -> None:
        super().remove_skipped(rid, processed)
        idx = self.last_state_idx.get(rid)
        if idx is not None and idx < cdiv(processed, self.block_size) - 1:
            blocks = self.req_blocks[rid]
            if not blocks[idx].is_null:
                self.pool.free_blocks([blocks[idx]])
                blocks[idx] = self.pool.null_block

    def num_blocks_to_allocate(
        self,
        rid: str,
        num_tokens: int,
        new_computed: Sequence[VBlock],
        total_computed: int,
        num_local: int,
        num_tokens_main: int,
    ) -> int:
        if new_computed and new_computed[-1].key in self.cached_this_step:
            return self.pool.num_blocks + 1  # a state cached this step: next step
        required = cdiv(num_tokens_main, self.block_size)
        new = required - len(new_computed) - len(self.req_blocks.get(rid, ()))
        partial = self._partial_local(new_computed, num_local) or rid in self.partial_hits
        if partial:
            new = max(new, 0) + 1
        if new > 0:
            new = min(new, 1 + int(partial))
        return new + sum(b.ref_cnt == 0 and not b.is_null for b in new_computed)

    def allocate_new(self, rid: str, num_tokens: int, num_tokens_main: int) -> list[VBlock]:
        blocks = self.req_blocks.setdefault(rid, [])
        required = cdiv(num_tokens_main, self.block_size)
        partial = self.partial_hits.get(rid)
        if required <= len(blocks) and partial is None:
            self.allocated.add(rid)
            return []
        prev = len(blocks)
        was_allocated = rid in self.allocated
        if was_allocated or prev > 0:
            self.last_state_idx[rid] = prev - 1
        skip_to = required - 1
        if prev < skip_to:
            blocks += [self.pool.null_block] * (skip_to - prev)
        n = max(required - len(blocks), 0) + (1 if partial is not None else 0)
        new = self.pool.get_new_blocks(n)
        returned = blocks[prev:]
        if partial is not None:
            idx, source = partial
            block, new = new[0], new[1:]
            if was_allocated:  # the running request keeps writing the source block
                self._move_keys(source, block)
                self.pending_copies.append((source, block))
                source.ref_cnt += 1
                if block.key is not None:
                    self.cached_this_step.add(block.key)
            else:
                self._apply_cow(rid, idx, source, block)
                returned = [block, *returned]
        blocks += new
        self.allocated.add(rid)
        self.partial_hits.pop(rid, None)
        return returned + new

    def _move_keys(self, src: VBlock, dst: VBlock) -> None:
        """Re-point ``src``'s cache entries at ``dst`` (no events: they stay live)."""
        tokens = src.key_tokens
        for key in self.pool._remove_keys(src):
            self.pool._insert(key, dst, tokens or 0)

    def cache(
        self, req: VRequest, num_tokens: int, retention: int | None, boundaries: Sequence[int]
    ) -> None:
        rid = req.request_id
        before = self.num_cached.get(rid, 0)
        self.cache_blocks(req, num_tokens, retention, boundaries)
        after = self.num_cached.get(rid, 0)
        key = self._cache_partial_tail(req, num_tokens)
        if key is not None:
            self.cached_this_step.add(key)
        blocks = self.req_blocks.get(rid, [])
        for blk in blocks[before:after]:
            if not blk.is_null and blk.key is not None:
                self.cached_this_step.add(blk.key)

    def _cache_partial_tail(self, req: VRequest, num_tokens: int) -> bytes | None:
        unit = self.pool.hash_block_size
        if num_tokens <= 0 or num_tokens % unit != 0:
            return None
        latest = mamba_checkpoint_position(req.num_prompt_tokens, unit, self.drop_eagle_checkpoint)
        if num_tokens != latest:
            return None
        idx = cdiv(num_tokens, self.block_size) - 1
        blocks = self.req_blocks[req.request_id]
        if idx >= len(blocks) or blocks[idx].is_null:
            return None
        source = blocks[idx]
        if source.key_tokens == num_tokens:
            return None
        key = self.pool.cache_partial_block(req, source, num_tokens, self.group_id)
        if key is not None and num_tokens % self.block_size:
            self.partial_hits[req.request_id] = (idx, source)
            self.num_cached[req.request_id] = idx
        return key

    def pop_for_free(self, rid: str) -> list[VBlock]:
        self.allocated.discard(rid)
        self.last_state_idx.pop(rid, None)
        self.retired.pop(rid, None)
        return super().pop_for_free(rid)

    def new_step(self) -> None:
        self.cached_this_step.clear()
