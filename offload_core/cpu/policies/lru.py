"""Least recently used: evict the block whose last store or use is oldest."""

from __future__ import annotations

from collections import OrderedDict

from offload_core.base import OffloadKey
from offload_core.cpu.policies.base import CanEvict, EvictionPolicy


class LRUPolicy(EvictionPolicy):
    """An ordered dict from oldest to most recent; every operation is O(1) amortised."""

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self._order: OrderedDict[OffloadKey, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._order)

    def __contains__(self, key: object) -> bool:
        return key in self._order

    def insert(self, key: OffloadKey) -> None:
        if key in self._order:
            raise ValueError("key already tracked")
        self._order[key] = None

    def touch(self, key: OffloadKey) -> None:
        if key in self._order:
            self._order.move_to_end(key)

    def remove(self, key: OffloadKey) -> None:
        self._order.pop(key, None)

    def evict(self, n: int, can_evict: CanEvict) -> list[OffloadKey] | None:
        if n <= 0:
            return []
        victims: list[OffloadKey] = []
        # Pinned blocks are skipped, not moved: a load in flight is not a use.
        for key in self._order:
            if can_evict(key):
                victims.append(key)
                if len(victims) == n:
                    break
        if len(victims) < n:
            return None
        for key in victims:
            del self._order[key]
        return victims

    def keys(self) -> list[OffloadKey]:
        """Tracked keys, next victim first (for inspection and tests)."""
        return list(self._order)
