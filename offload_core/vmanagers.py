"""Per-group cache managers with vLLM 0.33's rules (``single_type_kv_cache_manager.py``).

One manager per KV cache group keeps each request's block table and decides, for its
attention type, (a) how far a prefix hit reaches (``find_hit``), (b) which blocks of a
prefill it keys in the prefix cache (``mask``: sliding window keeps only the tails a
later hit can reach, mamba only the states at reachable boundaries) and (c) which
blocks it can let go while the request runs (``skipped``). Pure Python, no torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from offload_core.vpool import VBlock, VBlockPool
from schemas.hit_rule import GroupSpec

if TYPE_CHECKING:
    from offload_core.vrequest import VRequest


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def mamba_checkpoint_position(num_tokens: int, unit: int, drop_eagle: bool) -> int:
    """The boundary whose mamba state a prefill of ``num_tokens`` leaves reusable."""
    limit = num_tokens if drop_eagle else num_tokens - 1
    pos = limit // unit * unit
    if drop_eagle:
        pos -= unit
    return max(pos, 0)


class GroupManager:
    """Full attention (and MLA): every block of the prefix is needed and kept."""

    fine_grained = True  # may stop a hit at a hash-unit boundary inside a block

    def __init__(self, spec: GroupSpec, pool: VBlockPool, group_id: int, step: int) -> None:
        self.spec = spec
        self.pool = pool
        self.group_id = group_id
        self.block_size = spec.block_size
        self.alignment = step  # cache-hit alignment (the coordinator may lower it)
        self.use_eagle = False
        self.req_blocks: dict[str, list[VBlock]] = {}
        self.num_cached: dict[str, int] = {}
        self.partial_hits: dict[str, tuple[int, VBlock]] = {}
        self.pending_copies: list[tuple[VBlock, VBlock]] = []

    # ------------------------------------------------------------------ hits
    def find_hit(
        self, hashes: Sequence[bytes], max_len: int, groups: list[int], drop_eagle: bool
    ) -> tuple[list[list[VBlock]], int]:
        pool, b, unit, align = self.pool, self.block_size, self.pool.hash_block_size, self.alignment
        fine = align < b and b % align == 0
        view = pool._view(hashes, b)
        out: list[list[VBlock]] = [[] for _ in groups]
        for digest in view[: max_len // b]:
            got = pool.get_cached_block(digest, groups)
            if not got:
                break
            for lst, blk in zip(out, got, strict=True):
                lst.append(blk)
        hit = len(out[0]) * b
        if fine:
            scale = b // align
            first = len(out[0]) * scale
            top = min(first + scale - 1, max_len // align, len(hashes))
            for idx in range(top - 1, first - 1, -1):
                got = pool.get_cached_block(hashes[idx], groups)
                if not got:
                    continue
                for lst, blk in zip(out, got, strict=True):
                    lst.append(blk)
                hit = (idx + 1) * align
                break
        if drop_eagle and hit > 0:
            hit -= min(align, b)
        hit -= hit % align
        n = cdiv(hit, b)
        for lst in out:
            del lst[n:]
        del unit
        return out, hit

    # ------------------------------------------------------------ retention
    def mask(
        self, start: int, end: int, retention: int | None, boundaries: Sequence[int]
    ) -> list[bool] | None:
        return None

    def skipped(self, num_computed: int) -> int:
        return 0

    # ----------------------------------------------------------- allocation
    def _partial_local(self, new_computed: Sequence[VBlock], num_local: int) -> bool:
        return len(new_computed) > 0 and num_local % self.block_size != 0

    def num_blocks_to_allocate(
        self,
        rid: str,
        num_tokens: int,
        new_computed: Sequence[VBlock],
        total_computed: int,
        num_local: int,
        num_tokens_main: int,
    ) -> int:
        required = cdiv(num_tokens, self.block_size)
        have = len(self.req_blocks.get(rid, ()))
        if rid in self.num_cached:
            return max(required - have, 0)
        skipped_blocks = self.skipped(total_computed) // self.block_size
        local_blocks = len(new_computed) + have
        new = max(required - max(skipped_blocks, local_blocks), 0)
        skip_new = max(0, skipped_blocks - have)
        evictable = sum(b.ref_cnt == 0 and not b.is_null for b in new_computed[skip_new:])
        if self._partial_local(new_computed, num_local):
            new += 1
        return new + evictable

    def add_local_computed(
        self, rid: str, new_computed: Sequence[VBlock], num_local: int, num_external: int
    ) -> None:
        blocks = self.req_blocks.setdefault(rid, [])
        assert not blocks
        skipped = self.skipped(num_local + num_external) // self.block_size
        if skipped > 0:
            new_computed = new_computed[skipped:]
        self.pool.touch(new_computed)
        blocks += [self.pool.null_block] * skipped
        blocks += new_computed
        self.num_cached[rid] = len(blocks)
        if self._partial_local(new_computed, num_local):
            idx = num_local // self.block_size
            self.partial_hits[rid] = (idx, new_computed[-1])
            self.num_cached[rid] = idx

    def allocate_external(self, rid: str, num_local: int, num_external: int) -> None:
        total = num_local + num_external
        skipped = self.skipped(total)
        if skipped > 0:
            num_external = min(total - skipped, num_external)
        if num_external <= 0:
            return
        blocks = self.req_blocks.setdefault(rid, [])
        blocks += self.pool.get_new_blocks(max(0, cdiv(total, self.block_size) - len(blocks)))

    def allocate_new(self, rid: str, num_tokens: int, num_tokens_main: int) -> list[VBlock]:
        cow: list[VBlock] = []
        if rid in self.partial_hits:
            idx, source = self.partial_hits.pop(rid)
            block = self.pool.get_new_blocks(1)[0]
            self._apply_cow(rid, idx, source, block)
            cow.append(block)
        blocks = self.req_blocks.setdefault(rid, [])
        n = cdiv(num_tokens, self.block_size) - len(blocks)
        if n <= 0:
            return cow
        new = self.pool.get_new_blocks(n)
        blocks += new
        return cow + new

    def _apply_cow(self, rid: str, idx: int, source: VBlock, block: VBlock) -> None:
        """A hit ending inside a shared block: the request writes into a private copy;
        both ends stay referenced until the copy ran (``take_copies``)."""
        self.req_blocks[rid][idx] = block
        self.pending_copies.append((source, block))
        block.ref_cnt += 1

    # -------------------------------------------------------------- caching
    def cache_blocks(
        self, req: VRequest, num_tokens: int, retention: int | None, boundaries: Sequence[int]
    ) -> None:
        rid = req.request_id
        num_cached = self.num_cached.get(rid, 0)
        hashed_tokens = len(req.block_hashes) * self.pool.hash_block_size
        num_full = min(num_tokens, hashed_tokens) // self.block_size
        if num_cached >= num_full:
            return
        reach = list(boundaries)
        if req.shared_prefix_boundary:
            reach.append(req.shared_prefix_boundary)
            if self.use_eagle:
                reach.append(req.shared_prefix_boundary - self.block_size)
        mask = self.mask(num_cached, num_full, retention, reach)
        self.pool.cache_full_blocks(
            req, self.req_blocks[rid], num_cached, num_full, self.block_size, self.group_id, mask
        )
        self.num_cached[rid] = num_full

    def cache(
        self, req: VRequest, num_tokens: int, retention: int | None, boundaries: Sequence[int]
    ) -> None:
        """Full attention also keys the prompt's last hash-unit boundary when it ends
        inside a block (a *partial* block, promoted when the block fills)."""
        self.cache_blocks(req, num_tokens, retention, boundaries)
        unit = self.pool.hash_block_size
        if self.block_size == unit:
            return
        limit = req.num_prompt_tokens if self.use_eagle else req.num_prompt_tokens - 1
        boundary = min(limit // unit, len(req.block_hashes)) * unit
        if boundary == 0 or boundary > num_tokens or boundary % self.block_size == 0:
            return
        blocks = self.req_blocks[req.request_id]
        idx = boundary // self.block_size
        if idx < len(blocks):
            self.pool.cache_partial_block(req, blocks[idx], boundary, self.group_id)

    # ------------------------------------------------------------- freeing
    def remove_skipped(self, rid: str, processed: int) -> None:
        n = self.skipped(processed)
        if n <= 0:
            return
        blocks = self.req_blocks.setdefault(rid, [])
        self._remove_range(rid, 0, min(n // self.block_size, len(blocks)))

    def _remove_range(self, rid: str, first: int, last: int) -> None:
        blocks = self.req_blocks.get(rid)
        if blocks is None or first >= last:
            return
        last = min(last, len(blocks))
        freed = []
        for i in range(last - 1, first - 1, -1):
            if blocks[i].is_null:
                break
            freed.append(blocks[i])
            blocks[i] = self.pool.null_block
        if freed:
            self.pool.free_blocks(freed)

    def pop_for_free(self, rid: str) -> list[VBlock]:
        blocks = self.req_blocks.pop(rid, [])
        self.num_cached.pop(rid, None)
        self.partial_hits.pop(rid, None)
        head = 0
        while head < len(blocks) and blocks[head].is_null:
            head += 1
        return blocks[head:]

    def free(self, rid: str) -> None:
        self.pool.free_blocks(reversed(self.pop_for_free(rid)))

    def new_step(self) -> None:
        return None


class SlidingWindowManager(GroupManager):
    """A hit needs the window's last ``ceil((W-1)/b)`` blocks; older ones are dropped."""

    fine_grained = False

    @property
    def window(self) -> int:
        assert self.spec.sliding_window is not None
        return self.spec.sliding_window

    def need(self, eagle: bool) -> int:
        return cdiv(self.window - 1, self.block_size) + (1 if eagle else 0)

    def find_hit(
        self, hashes: Sequence[bytes], max_len: int, groups: list[int], drop_eagle: bool
    ) -> tuple[list[list[VBlock]], int]:
        pool, b, align = self.pool, self.block_size, self.alignment
        view = pool._view(hashes, b)
        need = self.need(drop_eagle)
        max_blocks = max_len // b
        null = pool.null_block
        out: list[list[VBlock]] = [[null] * max_blocks for _ in groups]
        run = 0
        found = False
        for i in range(max_blocks - 1, -1, -1):
            got = pool.get_cached_block(view[i], groups)
            if not got:
                run = 0
                continue
            if run == 0 and b != align:
                post = i if drop_eagle else i + 1
                if (post * b) % align != 0:
                    continue
            for lst, blk in zip(out, got, strict=True):
                lst[i] = blk
            run += 1
            if run >= need:
                for lst in out:
                    del lst[i + run :]
                found = True
                break
        if not found:
            for lst in out:
                del lst[run:]
            while b != align and len(out[0]) * b % align != 0:
                for lst in out:
                    lst.pop()
        if drop_eagle and out[0]:
            for lst in out:
                lst.pop()
            while b != align and len(out[0]) * b % align != 0:
                for lst in out:
                    lst.pop()
        return out, len(out[0]) * b

    def mask(
        self, start: int, end: int, retention: int | None, boundaries: Sequence[int]
    ) -> list[bool] | None:
        b, align = self.block_size, self.alignment
        if align % b != 0:
            return None
        need = self.need(self.use_eagle)
        shift = 1 if self.use_eagle else 0
        out = [False] * (end - start)
        segment = align if retention is None else (retention or None)
        if segment is not None:
            per = segment // b
            if need >= per:
                return None
            for i in range(start, end):
                if i >= shift and (i - shift) % per >= per - need:
                    out[i - start] = True
        if retention is not None:
            for tokens in boundaries:
                stop = tokens // align * align // b + shift
                for j in range(max(start, stop - need), min(end, stop)):
                    out[j - start] = True
        return out

    def skipped(self, num_computed: int) -> int:
        return max(0, num_computed - self.window + 1)

    def cache(
        self, req: VRequest, num_tokens: int, retention: int | None, boundaries: Sequence[int]
    ) -> None:
        self.cache_blocks(req, num_tokens, retention, boundaries)  # no partial tails
