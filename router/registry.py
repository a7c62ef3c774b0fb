"""The worker registry: who may be registered, and registering or removing one cleanly.

Split from :mod:`router.service` (which owns the lifecycle and the reads): every refusal
that can be known in advance comes before the index is touched, a refusal known only
after it is rolled back, and a registration and a removal of one id never interleave.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

import zmq

from router.config import RouterSettings, WorkerSpec
from router.index import IndexBackend, IndexUnavailable
from router.ingest.ingestor import Ingestor
from router.ingest.subscription import WorkerSubscription
from router.ingest.subscriptions import RegistrationUnavailable, SubscriptionManager
from router.logging_setup import event_extra
from router.netutil import connect_endpoint
from router.ratelimited_log import RateLimitedLog
from schemas.endpoints import parse_allow_list

log = logging.getLogger(__name__)


class WorkerExists(Exception):
    """A worker with this id is already registered (409)."""


class TooManyWorkers(Exception):
    """``max_workers`` are registered already (409)."""


class EndpointNotAllowed(Exception):
    """An endpoint names a host outside ``worker_allow`` (403)."""


class UnknownWorker(KeyError):
    """No worker with this id is registered (404)."""

    def __init__(self, worker_id: str) -> None:
        super().__init__(worker_id)
        self.worker_id = worker_id

    def __str__(self) -> str:
        return f"unknown worker {self.worker_id!r}"


# What a registration the router attempts by itself (a kept one, a listener topic) may be
# refused with: logged, never raised out of the start-up or the listener.
REFUSALS = (
    WorkerExists,
    ValueError,  # InvalidEndpoint, a kept registration that no longer validates
    TooManyWorkers,
    EndpointNotAllowed,
    RegistrationUnavailable,
)


class _IdLock:
    """A worker id's lock and how many callers hold it or wait for it."""

    __slots__ = ("lock", "users")

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.users = 0


class WorkerRegistry:
    """Registration and removal over the subscriptions, the ingestor and the index."""

    def __init__(
        self,
        settings: RouterSettings,
        index: IndexBackend,
        ingestor: Ingestor,
        subscriptions: SubscriptionManager,
    ) -> None:
        self.settings = settings
        self.index = index
        self.ingestor = ingestor
        self.subscriptions = subscriptions
        self._allow = parse_allow_list(settings.worker_allow)
        # Only ids with a registration or removal in progress (or waiting): a refused
        # registration of a fresh id leaves no entry behind.
        self.locks: dict[str, _IdLock] = {}
        self._limited = RateLimitedLog(log)

    def check(self, spec: WorkerSpec) -> None:
        """The refusals that need no socket and no index: ``WorkerExists``,
        ``TooManyWorkers``, ``EndpointNotAllowed``."""
        if spec.worker_id in self.subscriptions:
            raise WorkerExists(spec.worker_id)
        limit = self.settings.max_workers
        if len(self.subscriptions.all()) >= limit:
            raise TooManyWorkers(f"{limit} workers are registered (max_workers)")
        if self._allow:
            for ep in (spec.endpoint, spec.replay_endpoint, spec.http_endpoint):
                if ep is not None and not self._allow.allows(ep):
                    raise EndpointNotAllowed(f"endpoint {ep!r} is not in worker_allow")

    def probe(self, spec: WorkerSpec) -> None:
        """ZMQ's verdict on the endpoints the subscription will connect to, asked on
        throwaway sockets: ``InvalidEndpoint`` (or ``RegistrationUnavailable``) before
        the index is touched. A SUB without a subscription and a DEALER, as the
        subscription itself uses, so a publisher sees nothing it would not see anyway.
        An endpoint to bind is left to the subscription (binding it twice in a row would
        race the first socket's asynchronous close)."""
        if spec.via_listener:
            return
        targets: list[tuple[int, str]] = [] if spec.bind else [(zmq.SUB, spec.endpoint)]
        if spec.replay_endpoint is not None:
            targets.append((zmq.DEALER, spec.replay_endpoint))
        for kind, endpoint in targets:
            try:
                sock = self.subscriptions.context.socket(kind)
            except zmq.ZMQError as exc:  # out of sockets or file descriptors
                raise RegistrationUnavailable(
                    f"cannot open sockets for worker {spec.worker_id!r}: {exc.strerror}"
                ) from None
            try:
                connect_endpoint(sock, endpoint)
            finally:
                sock.close(linger=0)

    def register(self, spec: WorkerSpec) -> WorkerSubscription:
        self.check(spec)
        return self.subscriptions.add(spec)

    @contextlib.asynccontextmanager
    async def lifecycle(self, worker_id: str) -> AsyncIterator[None]:
        """Hold the worker id's lock: a removal (unsubscribe, then delete its index data)
        and a registration of the same id never interleave, so a re-registered worker's
        first batches cannot be deleted by the removal before it. The entry lives while
        someone holds or waits for it, so the table stays as small as the operations in
        progress, whatever ids requests name."""
        entry = self.locks.get(worker_id)
        if entry is None:
            entry = self.locks[worker_id] = _IdLock()
        entry.users += 1
        try:
            async with entry.lock:
                yield
        finally:
            entry.users -= 1
            if not entry.users:
                del self.locks[worker_id]

    async def add(self, spec: WorkerSpec, *, persist: bool = True) -> None:
        """Register and subscribe; raises ``WorkerExists``, ``InvalidEndpoint``,
        ``TooManyWorkers``, ``EndpointNotAllowed``, ``RegistrationUnavailable`` or
        ``IndexUnavailable``. A refused registration leaves no state behind.

        ``persist``: keep the registration in the index, so a restarted router (or a
        replica sharing Redis) registers it again."""
        worker_id = spec.worker_id
        async with self.lifecycle(worker_id):
            # Every refusal that can be known in advance comes before the index is touched.
            self.check(spec)
            self.probe(spec)
            fresh = await self.index.load_worker(worker_id) is None
            # Settings first: the subscription's first batch needs the hash unit.
            await self.ingestor.configure(worker_id, spec.engine_settings())
            try:
                self.register(spec)  # a bind that fails, sockets run out, max_workers
            except Exception:
                await self._undo_configure(worker_id, fresh)
                raise
            if persist and not spec.via_listener:
                await self.index.save_registration(worker_id, spec.model_dump_json().encode())
        log.info(
            "worker %s registered (%s)",
            worker_id,
            spec.endpoint,
            extra=event_extra("worker_registered", worker=worker_id, endpoint=spec.endpoint),
        )

    async def _undo_configure(self, worker_id: str, fresh: bool) -> None:
        """A registration refused after its settings were saved: drop them again (and the
        worker's index metadata where the index did not know it before)."""
        self.ingestor.forget(worker_id)
        if not fresh:
            return
        try:
            await self.index.remove_worker(worker_id)
        except IndexUnavailable as exc:
            log.warning("refused worker %s: its metadata stays in the index (%s)", worker_id, exc)

    async def remove(self, worker_id: str) -> None:
        """Unsubscribe and drop the worker's index entries and metadata."""
        async with self.lifecycle(worker_id):
            if worker_id not in self.subscriptions:
                raise UnknownWorker(worker_id)
            await self.subscriptions.remove(worker_id)
            await self.ingestor.remove_worker(worker_id)
            await self.index.delete_registration(worker_id)
        log.info(
            "worker %s removed", worker_id, extra=event_extra("worker_removed", worker=worker_id)
        )

    async def restore_registrations(self) -> None:
        """Workers registered over REST before a restart (kept in the index); raises
        ``IndexUnavailable`` (a later call restores the rest)."""
        kept = await self.index.load_registrations()
        for worker_id, blob in sorted(kept.items()):
            if worker_id in self.subscriptions:
                continue
            try:
                await self.add(WorkerSpec.model_validate_json(blob), persist=False)
            except REFUSALS as exc:
                log.warning("kept registration of %s not restored: %s", worker_id, exc)

    async def restore_worker(self, worker_id: str) -> None:
        """Save a worker's registration and settings again (the index lost them)."""
        sub = self.subscriptions.get(worker_id)
        if sub is None:
            return
        self.ingestor.forget(worker_id)
        await self.ingestor.configure(worker_id, sub.spec.engine_settings())
        if not sub.spec.via_listener and sub.spec not in self.settings.workers:
            await self.index.save_registration(worker_id, sub.spec.model_dump_json().encode())

    async def adopt(self, spec: WorkerSpec) -> WorkerSubscription | None:
        """A worker named by a new topic on the shared listener; None (the frame is
        dropped) when it cannot be registered now. Nothing here may end the listener:
        an index outage (the worker is adopted at a frame once the index answers) or
        ``max_workers`` reached would stop every engine the listener feeds."""
        try:
            await self.add(spec)
        except (*REFUSALS, IndexUnavailable) as exc:
            self._limited.warning(
                ("adopt", type(exc).__name__),
                "listener: cannot add worker %s: %s",
                spec.worker_id,
                exc,
                extra=event_extra("listener_adopt_failed", worker=spec.worker_id),
            )
            return None
        return self.subscriptions.get(spec.worker_id)
