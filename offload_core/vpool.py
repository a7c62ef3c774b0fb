"""A block pool that makes vLLM 0.33's cache decisions (``vllm/v1/core/block_pool.py``).

What the simulator must reproduce, because routers see it in the event stream:

* block 0 is the null block (placeholder for skipped sliding-window / mamba slots);
* cached blocks are **not** de-duplicated: a key may map to several blocks (a resent
  prompt re-caches its last block, concurrent requests prefill the same prefix), each
  announced by its own ``BlockStored`` and evicted by its own ``BlockRemoved``;
* freeing puts un-hashed blocks at the *head* of the free queue (reused first) and
  hashed blocks at the tail (LRU eviction), in the order given (callers pass tail first);
* a block may carry extra keys besides its primary hash (a partial entry registered at
  a ``hash_block_size`` boundary inside it); eviction removes every one of them;
* stores skip masked-out blocks but still send one (possibly empty) ``BlockStored``.

Pure Python, no torch; written from vLLM's behaviour, not copied.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

from offload_core.base import (
    OffloadKey,
    get_offload_block_hash,
    get_offload_group_idx,
    make_offload_key,
)
from offload_core.block_pool import BlockMeta
from schemas import MEDIUM_GPU, AllBlocksCleared, BlockRemoved, BlockStored, KVEvent
from schemas.hashing import external_hash
from schemas.wire import ExternalBlockHash


class VBlock:
    """One pool slot; ``key`` is its primary prefix-cache key while cached."""

    __slots__ = ("block_id", "is_null", "key", "key_tokens", "ref_cnt")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_cnt = 0
        self.key: OffloadKey | None = None
        self.key_tokens: int | None = None  # prefix length the primary key covers
        self.is_null = False

    def __repr__(self) -> str:
        return f"VBlock({self.block_id}, ref={self.ref_cnt}, hashed={self.key is not None})"


class VRequestView(Protocol):
    """What the pool needs from a request to build a ``BlockStored`` (``VRequest``)."""

    @property
    def token_ids(self) -> Sequence[int]: ...

    @property
    def block_hashes(self) -> Sequence[bytes]: ...

    @property
    def lora_name(self) -> str | None: ...

    @property
    def lora_id(self) -> int | None: ...

    @property
    def session_id(self) -> str | None: ...

    def event_extra_keys(self, start: int, end: int) -> tuple[Any, ...] | None: ...


class VBlockPool:
    """Every group's blocks, the free queue, and the (non-de-duplicated) cache index."""

    def __init__(
        self,
        num_blocks: int,
        hash_block_size: int,
        enable_events: bool = True,
        medium: str = MEDIUM_GPU,
    ) -> None:
        if num_blocks < 2:
            raise ValueError("num_blocks must be at least 2 (block 0 is the null block)")
        self.num_blocks = num_blocks
        self.hash_block_size = hash_block_size
        self.enable_events = enable_events
        self.medium = medium
        self.blocks = [VBlock(i) for i in range(num_blocks)]
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self._free.popitem(last=False)
        self.null_block = self.blocks[0]
        self.null_block.is_null = True
        # key -> {block_id: block}, oldest insertion first (the one a lookup returns).
        self._cached: dict[OffloadKey, dict[int, VBlock]] = {}
        # Secondary keys of a block (partial entries), in insertion order.
        self._extra: dict[int, list[OffloadKey]] = {}
        self._events: list[KVEvent] = []
        self.evictions = 0
        # Parent/tokens/LoRA of each keyed block, for re-announcing it on another tier.
        self.meta: dict[int, BlockMeta] = {}
        # (group, block id, digest) of every block keyed since the last drain: the
        # blocks whose KV the engine must have written.
        self.keyed: list[tuple[int, int, bytes]] = []
        # Called with the keyed blocks an allocation is about to evict, before it does.
        self.on_evict: Callable[[list[VBlock]], None] | None = None

    # ----------------------------------------------------------------- queries
    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    def get_cached_block(self, digest: bytes, group_ids: Sequence[int]) -> list[VBlock] | None:
        """The first cached block of ``digest`` in each group, or None on any miss."""
        out = []
        for g in group_ids:
            blocks = self._cached.get(make_offload_key(digest, g))
            if not blocks:
                return None
            out.append(next(iter(blocks.values())))
        return out

    def cached_keys(self) -> list[OffloadKey]:
        """Every distinct cached key (a key held by several blocks counts once)."""
        return list(self._cached)

    @property
    def num_cached_blocks(self) -> int:
        """Distinct cached keys (copies of one key count once)."""
        return len(self._cached)

    def num_cached_copies(self) -> int:
        return sum(len(b) for b in self._cached.values())

    def eviction_candidates(self, n: int) -> list[VBlock]:
        """Hashed blocks that ``get_new_blocks(n)`` would evict, in eviction order."""
        out = []
        for i, bid in enumerate(self._free):
            if i >= n:
                break
            if self.blocks[bid].key is not None:
                out.append(self.blocks[bid])
        return out

    # --------------------------------------------------------------- mutations
    def get_new_blocks(self, n: int) -> list[VBlock]:
        if n > len(self._free):
            raise ValueError(f"cannot get {n} free blocks from the pool")
        if self.on_evict is not None:
            doomed = self.eviction_candidates(n)
            if doomed:
                self.on_evict(doomed)
        out = []
        for _ in range(n):
            bid, _ = self._free.popitem(last=False)
            block = self.blocks[bid]
            self._evict(block)
            block.ref_cnt = 1
            out.append(block)
        return out

    def touch(self, blocks: Iterable[VBlock]) -> None:
        for block in blocks:
            if block.is_null:
                continue
            if block.ref_cnt == 0:
                del self._free[block.block_id]
            block.ref_cnt += 1

    def free_blocks(self, ordered: Iterable[VBlock]) -> None:
        """Un-hashed blocks go to the head (reused first), hashed ones to the tail."""
        first: list[VBlock] = []
        last: list[VBlock] = []
        for block in ordered:
            if block.is_null:
                continue
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                (first if block.key is None else last).append(block)
        for block in reversed(first):
            self._free[block.block_id] = None
            self._free.move_to_end(block.block_id, last=False)
        for block in last:
            self._free[block.block_id] = None

    def evict_block(self, block: VBlock) -> bool:
        """Drop every key of ``block`` (``BlockRemoved`` per key); True if it had any."""
        return self._evict(block)

    def reset(self) -> bool:
        if len(self._free) != self.num_blocks - 1:
            return False
        self._cached.clear()
        self._extra.clear()
        self.meta.clear()
        for block in self.blocks:
            block.key = None
            block.key_tokens = None
        if self.enable_events:
            self._events.append(AllBlocksCleared())
        return True

    def take_events(self) -> list[KVEvent]:
        events, self._events = self._events, []
        return events

    # ------------------------------------------------------------ caching
    def cache_full_blocks(
        self,
        request: VRequestView,
        blocks: Sequence[VBlock],
        num_cached: int,
        num_full: int,
        block_size: int,
        group: int,
        mask: Sequence[bool] | None = None,
    ) -> None:
        """Key ``blocks[num_cached:num_full]`` (null and masked-out ones skipped) and
        announce them in one ``BlockStored`` -- empty when every block was skipped."""
        if num_cached >= num_full:
            return
        hashes = self._view(request.block_hashes, block_size)
        stored: list[ExternalBlockHash] = []
        extra_keys: list[tuple[Any, ...] | None] = []
        for i in range(num_cached, num_full):
            blk = blocks[i]
            if blk.is_null or (mask is not None and not mask[i - num_cached]):
                continue
            digest = hashes[i]
            key = make_offload_key(digest, group)
            if blk.key is not None:  # partial -> full promotion of the same block
                self._emit_removed(self._remove_keys(blk))
            self._insert(key, blk, (i + 1) * block_size)
            self.keyed.append((group, blk.block_id, digest))
            self.meta[blk.block_id] = BlockMeta(
                hashes[i - 1] if i else None,
                tuple(request.token_ids[i * block_size : (i + 1) * block_size]),
                request.lora_name,
                request.event_extra_keys(i * block_size, (i + 1) * block_size),
            )
            stored.append(external_hash(digest))
            extra_keys.append(request.event_extra_keys(i * block_size, (i + 1) * block_size))
        if not self.enable_events:
            return
        parent = None if num_cached == 0 else external_hash(hashes[num_cached - 1])
        self._events.append(
            self._stored(
                request,
                stored,
                parent,
                request.token_ids[num_cached * block_size : num_full * block_size],
                block_size,
                group,
                extra_keys,
            )
        )

    def cache_partial_block(
        self,
        request: VRequestView,
        block: VBlock,
        num_tokens: int,
        group: int,
        replace_existing: bool = False,
    ) -> OffloadKey | None:
        """Register ``block`` under the prefix hash at ``num_tokens`` (a hash-unit
        boundary inside it); announced as a one-unit ``BlockStored``."""
        if block.is_null:
            return None
        hb = self.hash_block_size
        units = num_tokens // hb
        digest = request.block_hashes[units - 1]
        key = make_offload_key(digest, group)
        already = block.key == key or block.block_id in self._cached.get(key, {})
        if replace_existing:
            self._emit_removed(self._remove_keys(block))
            already = False
        elif (
            not already
            and block.key is not None
            and block.key_tokens is not None
            and block.key_tokens < units * hb
        ):
            self._emit_removed(self._remove_keys(block))
        self._insert(key, block, units * hb)
        if self.enable_events and not already:
            parent = external_hash(request.block_hashes[units - 2]) if units > 1 else None
            start = (units - 1) * hb
            self._events.append(
                self._stored(
                    request,
                    [external_hash(digest)],
                    parent,
                    request.token_ids[start:num_tokens],
                    num_tokens - start,
                    group,
                    [request.event_extra_keys(start, num_tokens)],
                )
            )
        return key

    def emit_cached(self, request: VRequestView, n: int, block_size: int, group: int) -> None:
        """Re-announce a hit's first ``n`` blocks (``kv_cache_report_mode="full"``);
        changes nothing. Null-padded slots of a sparse hit are announced too, as vLLM
        does."""
        if not self.enable_events or n == 0:
            return
        hashes = self._view(request.block_hashes, block_size)
        self._events.append(
            self._stored(
                request,
                [external_hash(hashes[i]) for i in range(n)],
                None,
                request.token_ids[: n * block_size],
                block_size,
                group,
                [request.event_extra_keys(i * block_size, (i + 1) * block_size) for i in range(n)],
            )
        )

    # ------------------------------------------------------------- helpers
    def _view(self, hashes: Sequence[bytes], block_size: int) -> Sequence[bytes]:
        """Hashes at ``block_size`` granularity: the last hash unit of each block."""
        scale = block_size // self.hash_block_size
        if scale == 1:
            return hashes
        return [hashes[(i + 1) * scale - 1] for i in range(len(hashes) // scale)]

    def _insert(self, key: OffloadKey, block: VBlock, num_tokens: int) -> None:
        if block.key == key:
            return
        holders = self._cached.setdefault(key, {})
        if block.block_id in holders:
            return
        if block.key is None:
            block.key = key
            block.key_tokens = num_tokens
        else:
            self._extra.setdefault(block.block_id, []).append(key)
        holders[block.block_id] = block

    def _remove_keys(self, block: VBlock) -> list[OffloadKey]:
        keys: list[OffloadKey] = []
        if block.key is not None:
            keys.append(block.key)
        keys += self._extra.pop(block.block_id, [])
        removed = []
        for key in keys:
            holders = self._cached.get(key)
            if holders is not None and holders.pop(block.block_id, None) is not None:
                removed.append(key)
                if not holders:
                    del self._cached[key]
        block.key = None
        block.key_tokens = None
        self.meta.pop(block.block_id, None)
        return removed

    def _evict(self, block: VBlock) -> bool:
        removed = self._remove_keys(block)
        if not removed:
            return False
        self.evictions += len(removed)
        self._emit_removed(removed)
        return True

    def _emit_removed(self, keys: list[OffloadKey]) -> None:
        if not self.enable_events:
            return
        for key in keys:
            self._events.append(
                BlockRemoved(
                    [external_hash(get_offload_block_hash(key))],
                    self.medium,
                    group_idx=get_offload_group_idx(key),
                )
            )

    def _stored(
        self,
        request: VRequestView,
        hashes: list[ExternalBlockHash],
        parent: int | None,
        token_ids: Sequence[int],
        block_size: int,
        group: int,
        extra_keys: list[tuple[Any, ...] | None],
    ) -> BlockStored:
        return BlockStored(
            block_hashes=hashes,
            parent_block_hash=parent,
            token_ids=list(token_ids),
            block_size=block_size,
            lora_id=request.lora_id,
            medium=self.medium,
            lora_name=request.lora_name,
            extra_keys=extra_keys if extra_keys else None,
            group_idx=group,
            session_id=request.session_id,
        )
