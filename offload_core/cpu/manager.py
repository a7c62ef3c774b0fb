"""Scheduler-side bookkeeping of a fixed pool of CPU blocks.

Each stored key owns one CPU block id from ``range(num_blocks)``. A key is *pending*
between ``prepare_store`` and ``complete_store`` (its block is reserved, it is invisible
to lookups and cannot be evicted) and *ready* afterwards. Ready blocks are ordered by an
eviction policy; a ready block with a non-zero ref count is being loaded and is never
evicted. No torch: the transfer worker owns the buffers and uses these ids as indices.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from offload_core.base import (
    OffloadingEvent,
    OffloadingManager,
    OffloadKey,
    PrepareStoreOutput,
    ReqContext,
)
from offload_core.cpu.common import CPU_MEDIUM, CPULoadStoreSpec
from offload_core.cpu.policies import EvictionPolicy, make_policy


class _Block:
    __slots__ = ("block_id", "ready", "ref_cnt")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_cnt = 0
        self.ready = False


class CPUOffloadingManager(OffloadingManager):
    """An ``OffloadingManager`` over ``num_blocks`` CPU blocks with LRU or ARC eviction."""

    def __init__(self, num_blocks: int, policy: str = "lru", enable_events: bool = True) -> None:
        if num_blocks < 0:
            raise ValueError("num_blocks must be >= 0")
        self.num_blocks = num_blocks
        self.policy: EvictionPolicy = make_policy(policy, num_blocks)
        self.enable_events = enable_events
        self._blocks: dict[OffloadKey, _Block] = {}
        # Pop from the end: low ids are handed out first, which keeps tests readable.
        self._free_ids: list[int] = list(range(num_blocks - 1, -1, -1))
        self._events: list[OffloadingEvent] = []

    # -- inspection -------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        """Blocks neither ready nor reserved."""
        return len(self._free_ids)

    def is_ready(self, key: OffloadKey) -> bool:
        """True once the key's store completed successfully (and until it is evicted)."""
        block = self._blocks.get(key)
        return block is not None and block.ready

    def contains(self, key: OffloadKey) -> bool:
        """True while the key holds a block, ready or still being stored."""
        return key in self._blocks

    def ref_count(self, key: OffloadKey) -> int:
        """Loads in flight for ``key`` (0 when unknown)."""
        block = self._blocks.get(key)
        return block.ref_cnt if block is not None else 0

    def ready_keys(self) -> list[OffloadKey]:
        """Every ready key (what the event stream says is in the CPU tier)."""
        return [key for key, block in self._blocks.items() if block.ready]

    def block_ids(self, keys: Sequence[OffloadKey]) -> list[int]:
        """CPU block ids of known (ready or pending) keys; raises KeyError otherwise."""
        return [self._blocks[key].block_id for key in keys]

    # -- OffloadingManager ------------------------------------------------------------
    def lookup(self, key: OffloadKey, ctx: ReqContext) -> bool | None:
        block = self._blocks.get(key)
        return block is not None and block.ready

    def prepare_load(self, keys: Sequence[OffloadKey], ctx: ReqContext) -> CPULoadStoreSpec:
        blocks = []
        for key in keys:
            block = self._blocks.get(key)
            if block is None or not block.ready:
                raise KeyError(f"block {key.hex()} is not ready in the CPU tier")
            blocks.append(block)
        for block in blocks:
            block.ref_cnt += 1
        return CPULoadStoreSpec([block.block_id for block in blocks])

    def touch(self, keys: Sequence[OffloadKey], ctx: ReqContext) -> None:
        policy = self.policy
        for key in keys:
            policy.touch(key)

    def complete_load(self, keys: Sequence[OffloadKey], ctx: ReqContext) -> None:
        needed: dict[OffloadKey, int] = {}
        for key in keys:
            needed[key] = needed.get(key, 0) + 1
        for key, count in needed.items():
            block = self._blocks.get(key)
            if block is None or block.ref_cnt < count:
                raise ValueError(f"block {key.hex()} is not being loaded")
        for key, count in needed.items():
            self._blocks[key].ref_cnt -= count

    def prepare_store(
        self, keys: Sequence[OffloadKey], ctx: ReqContext
    ) -> PrepareStoreOutput | None:
        blocks = self._blocks
        new_keys = list(dict.fromkeys(key for key in keys if key not in blocks))
        shortfall = len(new_keys) - len(self._free_ids)
        evicted: list[OffloadKey] = []
        if shortfall > 0:
            protected = set(keys)

            def can_evict(key: OffloadKey) -> bool:
                return blocks[key].ref_cnt == 0 and key not in protected

            victims = self.policy.evict(shortfall, can_evict)
            if victims is None:
                return None
            for key in victims:
                self._free_ids.append(blocks.pop(key).block_id)
            evicted = victims
            if self.enable_events:
                self._events.append(OffloadingEvent(list(victims), CPU_MEDIUM, removed=True))
        block_ids = []
        for key in new_keys:
            block = _Block(self._free_ids.pop())
            blocks[key] = block
            block_ids.append(block.block_id)
        return PrepareStoreOutput(new_keys, CPULoadStoreSpec(block_ids), evicted)

    def complete_store(
        self, keys: Sequence[OffloadKey], ctx: ReqContext, success: bool = True
    ) -> None:
        stored: list[OffloadKey] = []
        for key in keys:
            block = self._blocks.get(key)
            if block is None or block.ready:
                continue
            if success:
                block.ready = True
                self.policy.insert(key)
                stored.append(key)
            else:
                del self._blocks[key]
                self._free_ids.append(block.block_id)
        if stored and self.enable_events:
            self._events.append(OffloadingEvent(stored, CPU_MEDIUM, removed=False))

    def take_events(self) -> Iterable[OffloadingEvent]:
        events, self._events = self._events, []
        return events
