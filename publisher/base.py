"""The publisher interface an engine calls, and the publisher for engines without events.

Split from :mod:`publisher.zmq_publisher` so that the engine depends on the interface
(``publish``, ``shutdown``, counters) and not on how batches reach the wire.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from schemas import KVEventBatch


class EventPublisher(ABC):
    """What an engine needs: ``publish`` a batch, ``shutdown`` at exit, two counters."""

    def __init__(self, data_parallel_rank: int = 0) -> None:
        self.data_parallel_rank = data_parallel_rank
        self.published = 0
        self.dropped = 0

    @abstractmethod
    def publish(self, batch: KVEventBatch) -> None:
        """Hand ``batch`` over for publishing; never blocks, never raises for a full queue."""

    @abstractmethod
    def shutdown(self, timeout: float = 1.0) -> None:
        """Flush what is queued (within ``timeout`` seconds) and release every resource."""

    def counters(self) -> dict[str, int]:
        """Counter snapshot for metrics."""
        return {"published": self.published, "dropped": self.dropped}


class NullEventPublisher(EventPublisher):
    """Publishes nothing: the default when KV cache events are disabled."""

    def publish(self, batch: KVEventBatch) -> None:
        return

    def shutdown(self, timeout: float = 1.0) -> None:
        return
