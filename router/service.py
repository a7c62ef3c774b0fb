"""``RouterService``: everything a router process runs, independent of HTTP.

It owns the settings, the index backend, the ingestor (write side), the scorer (read
side), the worker registry with one ZMQ subscription per worker, metrics, and the
background tasks extensions add (routing TTLs, the SSE summariser). The FastAPI app is a
thin layer over it, so tests and benchmarks can drive the very same object.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from pydantic import Field

from router.config import RouterSettings, WorkerSpec
from router.index import IndexBackend, IndexUnavailable, make_index
from router.ingest.index_watch import IndexWatch
from router.ingest.ingestor import Ingestor
from router.ingest.listener import TopicListener
from router.ingest.subscription import WorkerSubscription
from router.ingest.subscriptions import RegistrationUnavailable, SubscriptionManager
from router.logging_setup import event_extra
from router.metrics import RouterMetrics
from router.netutil import InvalidEndpoint
from router.score.scorer import Scorer, ScoreResult, to_response
from schemas.endpoints import parse_allow_list
from schemas.rest import ScoreResponse, WorkerInfo

log = logging.getLogger(__name__)

BackgroundFactory = Callable[[], Awaitable[None]]

__all__ = [
    "EndpointNotAllowed",
    "InvalidEndpoint",
    "RegistrationUnavailable",
    "RouterService",
    "TooManyWorkers",
    "UnknownWorker",
    "WorkerExists",
    "WorkerStatus",
]


class WorkerStatus(WorkerInfo):
    """``WorkerInfo`` plus the transport's health: what an operator checks first."""

    decode_errors: int = 0
    replay_failures: int = 0
    duplicates: int = 0
    ingest_retries: int = 0
    ingest_lag_s: float = Field(default=0.0, description="age of the batch waiting for the index")


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


class RouterService:
    """The router's state and lifecycle; ``start()``/``stop()`` are idempotent."""

    def __init__(
        self, settings: RouterSettings | None = None, *, index: IndexBackend | None = None
    ) -> None:
        self.settings = settings if settings is not None else RouterSettings()
        s = self.settings
        self.index = index if index is not None else make_index(s.index, redis_url=s.redis_url)
        self.ingestor = Ingestor(
            self.index, default_kind=s.default_kind, default_block_size=s.default_block_size
        )
        self.scorer = Scorer(self.index, tier_weights=s.tier_weights)
        self._allow = parse_allow_list(s.worker_allow)
        self.subscriptions = SubscriptionManager(self.ingestor, s)
        self.metrics = RouterMetrics(
            self.index, self.ingestor, self.subscriptions, lambda: self.index_watch
        )
        # Appended to by the routing extension; read by dashboards.
        self.recent_routes: collections.deque[Any] = collections.deque(maxlen=s.recent_routes)
        self.started_at = time.time()
        self._background: list[BackgroundFactory] = []
        self._tasks: list[asyncio.Task[None]] = []
        self.listener: TopicListener | None = None
        self._locks: dict[str, asyncio.Lock] = {}
        self.index_watch: IndexWatch | None = None
        # The OpenAI proxy (router.proxy.OpenAIProxy) once router.proxy.install ran: the
        # dashboard summary reads its health. Any: router.proxy imports this module.
        self.proxy: Any = None
        self._running = False
        self._stopped = False
        for spec in s.workers:
            self._register(spec)

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        if self._running or self._stopped:
            return
        self._running = True
        for spec in self.settings.workers:
            await self.ingestor.configure(spec.worker_id, spec.engine_settings())
        await self._restore_registrations()
        self.subscriptions.start()
        if self.index.kind != "memory" and self.settings.index_check_s > 0:
            self.index_watch = IndexWatch(self, self.settings.index_check_s)
            self._tasks.append(asyncio.create_task(self.index_watch.run(), name="kvroute-watch"))
        if self.settings.listen is not None:
            listener = TopicListener(
                self.settings, self.subscriptions.context, self.subscriptions.get, self._adopt
            )
            self.listener = listener
            self._tasks.append(asyncio.create_task(listener.run(), name="kvroute-listener"))
        for factory in self._background:
            self._spawn(factory)
        log.info(
            "router started: index=%s workers=%d", self.index.kind, len(self.subscriptions.all())
        )

    async def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        self._running = False
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks.clear()
        await self.subscriptions.stop()
        with contextlib.suppress(Exception):
            await self.index.close()
        log.info("router stopped")

    async def _restore_registrations(self) -> None:
        """Workers registered over REST before a restart (kept in the index)."""
        try:
            kept = await self.index.load_registrations()
        except IndexUnavailable:
            log.warning("index unavailable at start-up: REST registrations not restored")
            return
        for worker_id, blob in sorted(kept.items()):
            if worker_id in self.subscriptions:
                continue
            try:
                await self.add_worker(WorkerSpec.model_validate_json(blob), persist=False)
            except (WorkerExists, InvalidEndpoint, ValueError) as exc:
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

    async def _adopt(self, spec: WorkerSpec) -> WorkerSubscription | None:
        """A worker named by a new topic on the shared listener."""
        try:
            await self.add_worker(spec)
        except (WorkerExists, InvalidEndpoint, ValueError) as exc:
            log.warning("listener: cannot add worker %s: %s", spec.worker_id, exc)
            return None
        return self.subscriptions.get(spec.worker_id)

    def add_background(self, factory: BackgroundFactory) -> None:
        """Run ``factory()`` as a task while the service runs (cancelled at stop)."""
        self._background.append(factory)
        if self._running:
            self._spawn(factory)

    def _spawn(self, factory: BackgroundFactory) -> None:
        async def guarded() -> None:
            try:
                await factory()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("background task %r failed", factory)

        self._tasks.append(asyncio.create_task(guarded()))

    # ------------------------------------------------------------------ workers
    def _register(self, spec: WorkerSpec) -> WorkerSubscription:
        if spec.worker_id in self.subscriptions:
            raise WorkerExists(spec.worker_id)
        limit = self.settings.max_workers
        if len(self.subscriptions.all()) >= limit:
            raise TooManyWorkers(f"{limit} workers are registered (max_workers)")
        if self._allow:
            for ep in (spec.endpoint, spec.replay_endpoint, spec.http_endpoint):
                if ep is not None and not self._allow.allows(ep):
                    raise EndpointNotAllowed(f"endpoint {ep!r} is not in worker_allow")
        return self.subscriptions.add(spec)

    def _lifecycle(self, worker_id: str) -> asyncio.Lock:
        """One lock per worker id: a removal (unsubscribe, then delete its index data)
        and a registration of the same id never interleave, so a re-registered worker's
        first batches cannot be deleted by the removal before it."""
        lock = self._locks.get(worker_id)
        if lock is None:
            lock = self._locks[worker_id] = asyncio.Lock()
        return lock

    async def add_worker(self, spec: WorkerSpec, *, persist: bool = True) -> WorkerStatus:
        """Register and subscribe; raises ``WorkerExists``, ``InvalidEndpoint``,
        ``TooManyWorkers``, ``EndpointNotAllowed`` or ``RegistrationUnavailable``.

        ``persist``: keep the registration in the index, so a restarted router (or a
        replica sharing Redis) registers it again."""
        async with self._lifecycle(spec.worker_id):
            if spec.worker_id in self.subscriptions:
                raise WorkerExists(spec.worker_id)
            # Settings first: the subscription's first batch needs the hash unit.
            await self.ingestor.configure(spec.worker_id, spec.engine_settings())
            self._register(spec)
            if persist and not spec.via_listener:
                await self.index.save_registration(spec.worker_id, spec.model_dump_json().encode())
        log.info(
            "worker %s registered (%s)",
            spec.worker_id,
            spec.endpoint,
            extra=event_extra("worker_registered", worker=spec.worker_id, endpoint=spec.endpoint),
        )
        return await self.worker_info(spec.worker_id)

    async def remove_worker(self, worker_id: str) -> None:
        """Unsubscribe and drop the worker's index entries and metadata."""
        async with self._lifecycle(worker_id):
            if worker_id not in self.subscriptions:
                raise UnknownWorker(worker_id)
            await self.subscriptions.remove(worker_id)
            await self.ingestor.remove_worker(worker_id)
            await self.index.delete_registration(worker_id)
        self._locks.pop(worker_id, None)
        log.info(
            "worker %s removed", worker_id, extra=event_extra("worker_removed", worker=worker_id)
        )

    def worker_ids(self) -> list[str]:
        return [sub.worker_id for sub in self.subscriptions.all()]

    def worker_spec(self, worker_id: str) -> WorkerSpec:
        sub = self.subscriptions.get(worker_id)
        if sub is None:
            raise UnknownWorker(worker_id)
        return sub.spec

    async def worker_info(self, worker_id: str) -> WorkerStatus:
        sub = self.subscriptions.get(worker_id)
        if sub is None:
            raise UnknownWorker(worker_id)
        try:
            groups = await self.ingestor.worker_groups(worker_id)
            hash_mode = await self.ingestor.hash_mode(worker_id)
        except IndexUnavailable:  # still report the transport side during an outage
            groups, hash_mode = {}, "unknown"
        c = sub.counters
        spec = sub.spec
        return WorkerStatus(
            worker_id=worker_id,
            endpoint=spec.endpoint,
            replay_endpoint=spec.replay_endpoint,
            topic=spec.topic,
            model=spec.model,
            http_endpoint=spec.http_endpoint,
            state=sub.state,  # type: ignore[arg-type]
            hash_mode=hash_mode,  # type: ignore[arg-type]
            last_seq={str(rank): seq for rank, seq in sorted(sub.last_seq.items())},
            events=c.events,
            gaps=c.gaps,
            replays=c.replays,
            resyncs=c.resyncs,
            silent=sub.silent,
            faulted=sub.faulted,
            partial_history=sub.partial_history,
            decode_errors=c.decode_errors,
            replay_failures=c.replay_failures,
            duplicates=c.duplicates,
            ingest_retries=c.ingest_retries,
            ingest_lag_s=round(sub.lag_seconds(), 3),
            groups=groups,
        )

    async def worker_infos(self) -> list[WorkerStatus]:
        return [await self.worker_info(w) for w in self.worker_ids()]

    # ------------------------------------------------------------------ reads
    async def score(
        self,
        token_ids: list[int],
        workers: list[str] | None = None,
        *,
        lora_name: str | None = None,
        cache_salt: str | None = None,
    ) -> ScoreResponse:
        """``score_result`` as the pydantic model (for callers that read or dump it)."""
        return to_response(
            await self.score_result(token_ids, workers, lora_name=lora_name, cache_salt=cache_salt)
        )

    async def score_result(
        self,
        token_ids: list[int],
        workers: list[str] | None = None,
        *,
        lora_name: str | None = None,
        cache_salt: str | None = None,
        skip_prefix_cache: bool = False,
    ) -> ScoreResult:
        """Score the named workers (default: all), best first, as msgspec Structs whose
        JSON is the API's answer; raises ``UnknownWorker`` or ``IndexUnavailable``."""
        if workers is None:
            worker_ids = self.worker_ids()
        else:
            for w in workers:
                if w not in self.subscriptions:
                    raise UnknownWorker(w)
            worker_ids = list(dict.fromkeys(workers))
        t0 = time.perf_counter()
        result = await self.scorer.score_result(
            token_ids,
            worker_ids,
            lora_name=lora_name,
            cache_salt=cache_salt,
            skip_prefix_cache=skip_prefix_cache,
        )
        self.metrics.score_latency.observe(time.perf_counter() - t0)
        subs = self.subscriptions
        for row in result.workers:
            sub = subs.get(row.worker_id)
            if sub is not None and sub.partial_history:
                row.lower_bound = True
        return result

    async def ready(self) -> bool:
        try:
            return bool(await self.index.ping())
        except Exception:
            return False

    async def index_stats(self) -> dict[str, Any]:
        stats = dict(await self.index.stats())
        stats["registered_workers"] = len(self.subscriptions.all())
        return stats
