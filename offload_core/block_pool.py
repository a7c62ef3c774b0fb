"""The GPU block pool: prefix caching per group, LRU-of-freed eviction, KV events.

Modelled on vLLM's ``BlockPool``: every group draws blocks from one pool; a cached block
is indexed by its ``(group, hash)`` key (an ``OffloadKey``, since groups of equal block
size carry the same hashes). A block whose ref count drops to 0 is *not* forgotten: it
joins the tail of the free queue and stays cached -- and hittable -- until allocation
reaches it at the head and reuses its slot. Only then is it evicted (``BlockRemoved``).
A request frees its blocks tail first, so a prompt's last blocks are evicted before its
shared prefix.

Unlike vLLM, a key is never cached twice (callers reuse the cached block instead of
caching a duplicate), so the published stream always describes a *set* of blocks.
Pure Python, no torch: the routing benchmark reuses it as the engine cache model.
"""

from __future__ import annotations

import zlib
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from itertools import islice
from typing import Any

from offload_core.base import (
    OffloadKey,
    get_offload_block_hash,
    get_offload_group_idx,
    make_offload_key,
)
from schemas import (
    MEDIUM_GPU,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    ExternalBlockHash,
    KVEvent,
)
from schemas.hashing import external_hash
from schemas.hit_rule import KIND_SLIDING, GroupSpec


def lora_id_for(lora_name: str | None) -> int | None:
    """A stable positive LoRA id for a name (vLLM publishes the adapter's int id)."""
    if lora_name is None:
        return None
    return (zlib.crc32(lora_name.encode()) & 0x7FFFFFFF) or 1


class BlockMeta:
    """What a cached block's ``BlockStored`` said about it, kept so that the block can be
    re-announced on another tier (CPU offload) with its parent and tokens."""

    __slots__ = ("extra_keys", "lora_name", "parent", "token_ids")

    def __init__(
        self,
        parent: bytes | None,
        token_ids: tuple[int, ...],
        lora_name: str | None,
        extra_keys: tuple[Any, ...] | None,
    ) -> None:
        self.parent = parent
        self.token_ids = token_ids
        self.lora_name = lora_name
        self.extra_keys = extra_keys


class KVBlock:
    """One pool slot. ``key`` and ``meta`` are set while the block is cached."""

    __slots__ = ("block_id", "key", "meta", "ref_cnt")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_cnt = 0
        self.key: OffloadKey | None = None
        self.meta: BlockMeta | None = None

    def __repr__(self) -> str:
        return f"KVBlock({self.block_id}, ref={self.ref_cnt}, cached={self.key is not None})"


class PoolExhaustedError(RuntimeError):
    """More blocks were asked for than are free."""


class BlockPool:
    """Fixed set of blocks shared by every KV cache group, with a prefix-cache index."""

    def __init__(
        self,
        num_blocks: int,
        groups: Sequence[GroupSpec],
        medium: str = MEDIUM_GPU,
        enable_events: bool = True,
    ) -> None:
        if num_blocks <= 0:
            raise ValueError("num_blocks must be positive")
        self.num_blocks = num_blocks
        self.groups = list(groups)
        self.medium = medium
        self.enable_events = enable_events
        self.blocks = [KVBlock(i) for i in range(num_blocks)]
        # Insertion order = free order: the head is the least recently freed block.
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self._cached: dict[OffloadKey, int] = {}
        self._events: list[KVEvent] = []
        self.evictions = 0

    # ----------------------------------------------------------------- queries
    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def num_cached_blocks(self) -> int:
        return len(self._cached)

    def get_cached_block(self, key: OffloadKey) -> int | None:
        """The block holding ``key``, or None (a cached block may be free: still a hit)."""
        return self._cached.get(key)

    def __contains__(self, key: object) -> bool:
        return key in self._cached

    def cached_keys(self) -> list[OffloadKey]:
        return list(self._cached)

    def eviction_candidates(self, n: int) -> list[int]:
        """Cached blocks that ``allocate(n)`` would evict, in eviction order.

        The engine offloads these to the CPU tier *before* their slots are reused.
        """
        blocks = self.blocks
        return [b for b in islice(self._free, n) if blocks[b].key is not None]

    # --------------------------------------------------------------- mutations
    def touch(self, block_ids: Iterable[int]) -> None:
        """Take a reference on blocks (a hit): a free cached block leaves the free queue."""
        for bid in block_ids:
            block = self.blocks[bid]
            if block.ref_cnt == 0:
                del self._free[bid]
            block.ref_cnt += 1

    def allocate(self, n: int) -> list[int]:
        """Pop ``n`` blocks from the free queue's head (ref count 1), evicting cached ones."""
        if n > len(self._free):
            raise PoolExhaustedError(f"asked for {n} blocks, {len(self._free)} free")
        out: list[int] = []
        evicted: list[OffloadKey] = []
        for _ in range(n):
            bid, _ = self._free.popitem(last=False)
            block = self.blocks[bid]
            if block.key is not None:
                evicted.append(block.key)
                del self._cached[block.key]
                block.key = None
                block.meta = None
            block.ref_cnt = 1
            out.append(bid)
        if evicted:
            self.evictions += len(evicted)
            self._emit_removed(evicted)
        return out

    def free(self, block_ids: Iterable[int]) -> None:
        """Drop one reference each; blocks reaching 0 join the free queue's tail, in order.

        Pass a request's blocks tail first so its last blocks are evicted first.
        """
        for bid in block_ids:
            block = self.blocks[bid]
            if block.ref_cnt <= 0:
                raise ValueError(f"block {bid} freed more often than referenced")
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                self._free[bid] = None

    def cache_blocks(
        self,
        group_idx: int,
        block_ids: Sequence[int],
        digests: Sequence[bytes],
        parent: bytes | None,
        token_ids: Sequence[int],
        lora_name: str | None = None,
        extra_keys: list[tuple[Any, ...] | None] | None = None,
    ) -> None:
        """Index a chain of newly filled blocks and announce them in one ``BlockStored``.

        ``digests[i]`` is the full hash of ``block_ids[i]``; the chain continues from
        ``parent`` (None for a chain starting at block 0); ``token_ids`` are the tokens
        of exactly these blocks. Caching a key that is already cached is a caller bug.
        """
        if len(block_ids) != len(digests):
            raise ValueError("block_ids and digests differ in length")
        if not block_ids:
            return
        spec = self.groups[group_idx]
        size = spec.block_size
        if len(token_ids) != size * len(block_ids):
            raise ValueError("token_ids must hold exactly the tokens of the cached blocks")
        prev = parent
        for i, (bid, digest) in enumerate(zip(block_ids, digests, strict=True)):
            key = make_offload_key(digest, group_idx)
            block = self.blocks[bid]
            if key in self._cached or block.key is not None:
                raise ValueError(f"block {bid} or its key is already cached")
            block.key = key
            block.meta = BlockMeta(
                prev,
                tuple(token_ids[i * size : (i + 1) * size]),
                lora_name,
                extra_keys[i] if extra_keys else None,
            )
            self._cached[key] = bid
            prev = digest
        if self.enable_events:
            self._events.append(
                BlockStored(
                    block_hashes=[external_hash(d) for d in digests],
                    parent_block_hash=None if parent is None else external_hash(parent),
                    token_ids=list(token_ids),
                    block_size=spec.block_size,
                    lora_id=lora_id_for(lora_name),
                    medium=self.medium,
                    lora_name=lora_name,
                    extra_keys=extra_keys,
                    group_idx=group_idx,
                    kv_cache_spec_kind=spec.kind,
                    kv_cache_spec_sliding_window=(
                        spec.sliding_window if spec.kind == KIND_SLIDING else None
                    ),
                )
            )

    def reset(self) -> bool:
        """Forget every cached block (``AllBlocksCleared``); refused while blocks are in use."""
        if len(self._free) != self.num_blocks:
            return False
        for bid in self._cached.values():
            self.blocks[bid].key = None
            self.blocks[bid].meta = None
        self._cached.clear()
        if self.enable_events:
            self._events.append(AllBlocksCleared())
        return True

    def take_events(self) -> list[KVEvent]:
        """Drain the events produced since the last call, oldest first."""
        events, self._events = self._events, []
        return events

    # ----------------------------------------------------------------- helpers
    def _emit_removed(self, keys: list[OffloadKey]) -> None:
        """One ``BlockRemoved`` per run of consecutive evictions from the same group."""
        if not self.enable_events:
            return
        run: list[ExternalBlockHash] = []
        run_group = -1
        for key in keys:
            group = get_offload_group_idx(key)
            if group != run_group and run:
                self._events.append(BlockRemoved(run, self.medium, group_idx=run_group))
                run = []
            run_group = group
            run.append(external_hash(get_offload_block_hash(key)))
        self._events.append(BlockRemoved(run, self.medium, group_idx=run_group))
