"""The set of live subscriptions, over one ZMQ context sized for ``max_workers``."""

from __future__ import annotations

from typing import TYPE_CHECKING

import zmq
import zmq.asyncio

from router.config import RouterSettings, WorkerSpec
from router.ingest.listener import FedSubscription
from router.ingest.subscription import WorkerSubscription

if TYPE_CHECKING:
    from router.ingest.ingestor import Ingestor

# ZMQ sockets one worker may hold at once: SUB, its monitor PAIR (two ends), and a replay
# DEALER; the context's socket limit is sized from ``max_workers`` with this and a margin.
SOCKETS_PER_WORKER = 4
_SOCKET_MARGIN = 64


class RegistrationUnavailable(Exception):
    """The sockets for a new worker could not be opened (503; retry later)."""


class SubscriptionManager:
    """The set of live subscriptions; one ZMQ context for all of them."""

    def __init__(self, ingestor: Ingestor, settings: RouterSettings) -> None:
        self._ingestor = ingestor
        self._settings = settings
        self._ctx = zmq.asyncio.Context()
        budget = settings.max_workers * SOCKETS_PER_WORKER + _SOCKET_MARGIN
        if self._ctx.get(zmq.MAX_SOCKETS) < budget:
            self._ctx.set(zmq.MAX_SOCKETS, budget)
        self._subs: dict[str, WorkerSubscription] = {}
        self._running = False

    @property
    def context(self) -> zmq.asyncio.Context:
        return self._ctx

    def __contains__(self, worker_id: object) -> bool:
        return worker_id in self._subs

    def get(self, worker_id: str) -> WorkerSubscription | None:
        return self._subs.get(worker_id)

    def all(self) -> list[WorkerSubscription]:
        return list(self._subs.values())

    def add(self, spec: WorkerSpec) -> WorkerSubscription:
        """Open the sockets (raises ``InvalidEndpoint``); start at once if running."""
        if spec.worker_id in self._subs:
            raise KeyError(spec.worker_id)
        try:
            kind = FedSubscription if spec.via_listener else WorkerSubscription
            sub = kind(spec, self._ctx, self._ingestor, self._settings)
        except zmq.ZMQError as exc:  # out of sockets or file descriptors
            raise RegistrationUnavailable(
                f"cannot open sockets for worker {spec.worker_id!r}: {exc.strerror}"
            ) from None
        self._subs[spec.worker_id] = sub
        if self._running:
            sub.start()
        return sub

    async def remove(self, worker_id: str) -> None:
        sub = self._subs.pop(worker_id)
        await sub.stop()

    def start(self) -> None:
        self._running = True
        for sub in self._subs.values():
            sub.start()

    async def stop(self) -> None:
        self._running = False
        for worker_id in list(self._subs):
            await self.remove(worker_id)
        self._ctx.destroy(linger=0)
