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
from router.ingest.subscriptions import RegistrationUnavailable, SubscriptionManager
from router.logging_setup import event_extra
from router.metrics import RouterMetrics
from router.netutil import InvalidEndpoint
from router.ratelimited_log import RateLimitedLog
from router.registry import (
    EndpointNotAllowed,
    TooManyWorkers,
    UnknownWorker,
    WorkerExists,
    WorkerRegistry,
)
from router.score.scorer import Scorer, ScoreResult, to_response
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


# How long a cancelled task may take to end before it is cancelled again (``_end``).
RECANCEL_AFTER_S = 0.5


async def _end(task: asyncio.Task[None]) -> None:
    """Await a cancelled task, cancelling it again for as long as it lives on: redis-py
    can swallow a cancellation that lands as its command completes, and a loop that does
    not check a stop flag of its own (the shared listener's, feeding a worker into Redis)
    then simply waits for its next frame -- and ``stop()`` would wait forever."""
    while not task.done():
        await asyncio.wait({task}, timeout=RECANCEL_AFTER_S)
        if not task.done():
            task.cancel()
    if not task.cancelled():
        task.exception()  # retrieved (a failure at stop is not worth a warning)


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
        self.subscriptions = SubscriptionManager(self.ingestor, s)
        self.registry = WorkerRegistry(s, self.index, self.ingestor, self.subscriptions)
        self.metrics = RouterMetrics(
            self.index,
            self.ingestor,
            self.subscriptions,
            lambda: self.index_watch,
            lambda: self.listener,
        )
        # Appended to by the routing extension; read by dashboards.
        self.recent_routes: collections.deque[Any] = collections.deque(maxlen=s.recent_routes)
        self.started_at = time.time()
        self._background: list[BackgroundFactory] = []
        self._tasks: list[asyncio.Task[None]] = []
        self.listener: TopicListener | None = None
        # True from a start-up the index did not answer until the workers are set up in it
        # (``_set_up_index``): not ready, and scores answer "index unavailable".
        self._index_pending = False
        self._limited = RateLimitedLog(log)
        self.index_watch: IndexWatch | None = None
        # The OpenAI proxy (router.proxy.OpenAIProxy) once router.proxy.install ran: the
        # dashboard summary reads its health. Any: router.proxy imports this module.
        self.proxy: Any = None
        self._running = False
        self._stopped = False
        for spec in s.workers:
            self.registry.register(spec)

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        """Start ingesting and serving. An index that does not answer yet does not stop
        it: the workers' subscriptions are open (frames wait in their SUB queues, and the
        catch-up replay fetches the rest) and are set up in the index in the background,
        retried with the ingest backoff, once it answers; until then ``ready()`` is False
        and scores raise ``IndexUnavailable`` (503)."""
        if self._running or self._stopped:
            return
        self._running = True
        if not await self._set_up_index():
            self._index_pending = True
            log.warning(
                "the %s index is unavailable at start-up: its %d worker(s) will be set up in "
                "it, and ingestion will start, once it answers (retrying with backoff)",
                self.index.kind,
                len(self.subscriptions.all()),
                extra=event_extra("index_setup_deferred", workers=len(self.subscriptions.all())),
            )
            self._tasks.append(
                asyncio.create_task(self._set_up_when_index_answers(), name="kvroute-index-setup")
            )
        if self.settings.listen is not None:
            listener = TopicListener(
                self.settings,
                self.subscriptions.context,
                self.subscriptions.get,
                self.registry.adopt,
            )
            self.listener = listener
            self._tasks.append(asyncio.create_task(listener.run(), name="kvroute-listener"))
        for factory in self._background:
            self._spawn(factory)
        log.info(
            "router started: index=%s workers=%d", self.index.kind, len(self.subscriptions.all())
        )

    async def _set_up_index(self) -> bool:
        """Save the start-up workers' settings in the index (their first batch needs the
        hash unit), register again the workers it kept, then start the subscriptions and
        the index watch. False, with nothing started, while the index does not answer;
        every step is idempotent, so a later call picks up where this one stopped."""
        try:
            for spec in self.settings.workers:
                async with self.registry.lifecycle(spec.worker_id):
                    sub = self.subscriptions.get(spec.worker_id)
                    if sub is None or sub.spec is not spec:  # removed (or replaced) meanwhile
                        continue
                    await self.ingestor.configure(spec.worker_id, spec.engine_settings())
            await self.registry.restore_registrations()
        except IndexUnavailable:
            return False
        if self._stopped:
            return True
        self.subscriptions.start()
        if self.index.kind != "memory" and self.settings.index_check_s > 0:
            self.index_watch = IndexWatch(self, self.settings.index_check_s)
            self._tasks.append(asyncio.create_task(self.index_watch.run(), name="kvroute-watch"))
        return True

    async def _set_up_when_index_answers(self) -> None:
        """``_set_up_index`` again, with the ingest backoff, until it succeeds."""
        delay = self.settings.ingest_retry_initial_s
        while True:
            await asyncio.sleep(delay)
            delay = min(delay * 2, self.settings.ingest_retry_max_s)
            try:
                done = await self._set_up_index()
            except Exception:  # a bug, not an outage: keep it visible, keep trying
                self._limited.exception(
                    "index_setup_failed",
                    "setting the workers up in the index failed; retrying",
                    extra=event_extra("index_setup_failed"),
                )
                continue
            if done:
                break
        self._index_pending = False
        log.info(
            "the %s index answers: %d worker(s) set up, ingestion started",
            self.index.kind,
            len(self.subscriptions.all()),
            extra=event_extra("index_setup_done", workers=len(self.subscriptions.all())),
        )

    async def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        self._running = False
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            await _end(task)
        self._tasks.clear()
        await self.subscriptions.stop()
        with contextlib.suppress(Exception):
            await self.index.close()
        log.info("router stopped")

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
    async def add_worker(self, spec: WorkerSpec, *, persist: bool = True) -> WorkerStatus:
        """Register and subscribe (``WorkerRegistry.add``: its refusals, none leaving state
        behind); ``persist`` keeps the registration in the index for a restart."""
        await self.registry.add(spec, persist=persist)
        return await self.worker_info(spec.worker_id)

    async def remove_worker(self, worker_id: str) -> None:
        """Unsubscribe and drop the worker's index entries and metadata; then the routing
        state kept for it (in-flight load, recent share, speed) goes too, so a worker
        registered again under the id starts as a new one."""
        await self.registry.remove(worker_id)
        routing = getattr(self, "routing", None)  # installed by router.http.routing
        if routing is not None:
            routing.forget_worker(worker_id)

    async def restore_worker(self, worker_id: str) -> None:
        """Save a worker's registration and settings again (the index lost them)."""
        await self.registry.restore_worker(worker_id)

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
        if self._index_pending:
            raise IndexUnavailable("the index has not answered since start-up")
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
        """The index answers and the workers are set up in it."""
        if self._index_pending:
            return False
        try:
            return bool(await self.index.ping())
        except Exception:
            return False

    async def index_stats(self) -> dict[str, Any]:
        stats = dict(await self.index.stats())
        stats["registered_workers"] = len(self.subscriptions.all())
        return stats
