"""The tiny interface between the CPU manager and an eviction policy.

A policy only orders *ready* blocks (stored and visible to lookups); the manager keeps
reservations, pins and block ids. The manager asks for victims with a predicate that
says which blocks may go (unpinned, not part of the store being prepared), so the policy
never needs to know about ref counts.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable

from offload_core.base import OffloadKey

CanEvict = Callable[[OffloadKey], bool]


class EvictionPolicy(ABC):
    """Orders ready blocks for eviction; holds at most ``capacity`` of them."""

    def __init__(self, capacity: int) -> None:
        if capacity < 0:
            raise ValueError("capacity must be >= 0")
        self.capacity = capacity

    @abstractmethod
    def __len__(self) -> int:
        """Number of ready blocks tracked."""

    @abstractmethod
    def __contains__(self, key: object) -> bool:
        """Whether ``key`` is a tracked ready block (ghost entries do not count)."""

    @abstractmethod
    def insert(self, key: OffloadKey) -> None:
        """A block became ready. ``key`` must not be tracked already."""

    @abstractmethod
    def touch(self, key: OffloadKey) -> None:
        """A tracked block was used again; untracked keys are ignored."""

    @abstractmethod
    def remove(self, key: OffloadKey) -> None:
        """Forget a tracked block the manager dropped itself; untracked keys are ignored."""

    @abstractmethod
    def evict(self, n: int, can_evict: CanEvict) -> list[OffloadKey] | None:
        """Choose and forget ``n`` blocks for which ``can_evict`` is true.

        All or nothing: returns None, changing nothing, when fewer than ``n`` such blocks
        exist. Victims come in eviction order.
        """
