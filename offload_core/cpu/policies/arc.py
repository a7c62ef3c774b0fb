"""Adaptive replacement cache (Megiddo & Modha, FAST '03) over ready CPU blocks.

Resident blocks sit in T1 (seen once since they were stored) or T2 (used again); the
ghost lists B1 and B2 remember keys recently evicted from each, without data. A store
of a key found in B1 means recency was undervalued, so the target size ``p`` of T1 grows;
one found in B2 shrinks it. Eviction takes T1's oldest block while T1 is larger than
``p``, else T2's oldest. A one-pass scan therefore churns T1 and leaves the frequently
used blocks of T2 alone, which LRU cannot do.

Departures from the paper, forced by the store protocol: the ghost hit is credited when
the store *completes* (``insert``), after room was made, and eviction cannot peek at the
incoming key, so the tie ``|T1| == p`` goes to T2.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator

from offload_core.base import OffloadKey
from offload_core.cpu.policies.base import CanEvict, EvictionPolicy

_List = OrderedDict[OffloadKey, None]


class ARCPolicy(EvictionPolicy):
    """ARC with ghost lists bounded so that T1+B1 <= c and T1+T2+B1+B2 <= 2c."""

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self._t1: _List = OrderedDict()
        self._t2: _List = OrderedDict()
        self._b1: _List = OrderedDict()
        self._b2: _List = OrderedDict()
        self._p = 0.0

    @property
    def p(self) -> float:
        """Target size of T1 (recency side), between 0 and capacity."""
        return self._p

    def __len__(self) -> int:
        return len(self._t1) + len(self._t2)

    def __contains__(self, key: object) -> bool:
        return key in self._t1 or key in self._t2

    def insert(self, key: OffloadKey) -> None:
        if key in self:
            raise ValueError("key already tracked")
        c = self.capacity
        if key in self._b1:
            delta = max(1.0, len(self._b2) / len(self._b1))
            self._p = min(float(c), self._p + delta)
            del self._b1[key]
            self._t2[key] = None
        elif key in self._b2:
            delta = max(1.0, len(self._b1) / len(self._b2))
            self._p = max(0.0, self._p - delta)
            del self._b2[key]
            self._t2[key] = None
        else:
            self._t1[key] = None
        self._trim_ghosts()

    def touch(self, key: OffloadKey) -> None:
        if key in self._t1:
            del self._t1[key]
            self._t2[key] = None
        elif key in self._t2:
            self._t2.move_to_end(key)

    def remove(self, key: OffloadKey) -> None:
        self._t1.pop(key, None)
        self._t2.pop(key, None)

    def evict(self, n: int, can_evict: CanEvict) -> list[OffloadKey] | None:
        if n <= 0:
            return []
        # Dry run first so that a shortfall changes nothing.
        it1 = _evictable(self._t1, can_evict)
        it2 = _evictable(self._t2, can_evict)
        head1, head2 = next(it1, None), next(it2, None)
        t1_len = len(self._t1)
        picks: list[tuple[OffloadKey, bool]] = []  # (key, came from T1)
        while len(picks) < n:
            from_t1 = head1 is not None and (t1_len > self._p or head2 is None)
            if from_t1:
                assert head1 is not None
                picks.append((head1, True))
                t1_len -= 1
                head1 = next(it1, None)
            elif head2 is not None:
                picks.append((head2, False))
                head2 = next(it2, None)
            else:
                return None
        for key, from_t1 in picks:
            if from_t1:
                del self._t1[key]
                self._b1[key] = None
            else:
                del self._t2[key]
                self._b2[key] = None
        self._trim_ghosts()
        return [key for key, _ in picks]

    def _trim_ghosts(self) -> None:
        c = self.capacity
        while self._b1 and len(self._t1) + len(self._b1) > c:
            self._b1.popitem(last=False)
        while len(self) + len(self._b1) + len(self._b2) > 2 * c and (self._b1 or self._b2):
            (self._b2 or self._b1).popitem(last=False)

    # Inspection (tests, docs, debugging).
    def lists(self) -> dict[str, list[OffloadKey]]:
        """The four lists, each oldest first."""
        return {
            "t1": list(self._t1),
            "t2": list(self._t2),
            "b1": list(self._b1),
            "b2": list(self._b2),
        }


def _evictable(order: _List, can_evict: CanEvict) -> Iterator[OffloadKey]:
    return (key for key in order if can_evict(key))
