"""The subscriber's write path into the index: stage, merge, write, retry.

Staging: consecutive batches of a backlog go to the ``Ingestor`` as one merged batch -
the same events in the same order (every ingest step is order-exact and idempotent),
but one index call (one Redis round trip) instead of one per batch.

Outages: every ingest operation is idempotent, so a half-applied batch is simply retried
with backoff; the subscriber stalls (frames wait in its SUB queue, and a replay recovers
any it drops) instead of skipping data, and ``lag_seconds`` shows how long it has been
stuck.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Protocol

from router.config import RouterSettings
from router.index.base import FOLLOWS_NOTHING, IndexUnavailable
from router.logging_setup import event_extra
from router.ratelimited_log import RateLimitedLog
from schemas import KVEventBatch

if TYPE_CHECKING:
    from router.ingest.ingestor import Ingestor

log = logging.getLogger("router.ingest.subscription")


# Events staged before they are written to the index as one merged batch.
STAGE_EVENTS = 2048


class WriterCounters(Protocol):
    batches: int
    events: int
    ingest_retries: int
    ingest_errors: int


class IndexRetry:
    """Per worker: run index calls until the index takes them."""

    def __init__(self, worker_id: str, settings: RouterSettings, counters: WriterCounters) -> None:
        self.worker_id = worker_id
        self.counters = counters
        self.retrying_since: float | None = None
        self._initial = settings.ingest_retry_initial_s
        self._max = settings.ingest_retry_max_s
        self._limited = RateLimitedLog(log)

    def lag_seconds(self) -> float:
        """How long the call in progress has waited for the index (0 when none)."""
        since = self.retrying_since
        return 0.0 if since is None else time.monotonic() - since

    async def call(self, fn: Callable[..., Awaitable[object]], *args: object) -> bool:
        """Await ``fn(*args)``, retrying on ``IndexUnavailable`` with exponential backoff.

        Returns False (counted in ``ingest_errors``) if it failed for any other reason:
        a bug must not kill the subscription, and the batch cannot succeed on retry.
        """
        delay = self._initial
        while True:
            try:
                await fn(*args)
            except IndexUnavailable as exc:
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    # redis-py may turn a cancellation mid-command into a connection
                    # error: the task is stopping, not the index failing.
                    raise asyncio.CancelledError from exc
                if self.retrying_since is None:
                    self.retrying_since = time.monotonic()
                    log.warning(
                        "worker %s: index unavailable (%s); retrying",
                        self.worker_id,
                        exc,
                        extra=event_extra("index_unavailable", worker=self.worker_id),
                    )
                self.counters.ingest_retries += 1
                await asyncio.sleep(delay)
                delay = min(delay * 2, self._max)
                continue
            except Exception:
                self.counters.ingest_errors += 1
                self._limited.exception(
                    "ingest_failed",
                    "worker %s: index write failed (%d so far); the worker will be rebuilt",
                    self.worker_id,
                    self.counters.ingest_errors,
                    extra=event_extra("ingest_failed", worker=self.worker_id),
                )
                self.retrying_since = None
                return False
            if self.retrying_since is not None:
                log.info(
                    "worker %s: index back, ingestion resumed",
                    self.worker_id,
                    extra=event_extra("index_recovered", worker=self.worker_id),
                )
                self.retrying_since = None
            return True


class IndexWriter:
    """Per worker: staged batches, the seqs the index has taken, clears - all in order."""

    def __init__(
        self,
        worker_id: str,
        ingestor: Ingestor,
        settings: RouterSettings,
        counters: WriterCounters,
    ) -> None:
        self.worker_id = worker_id
        self.written: dict[int, int] = {}  # per DP rank, the last seq the index took
        self.retry = IndexRetry(worker_id, settings, counters)
        self._ingestor = ingestor
        self._counters = counters
        self._staged: list[tuple[int, int, int, KVEventBatch]] = []
        self._staged_events = 0
        # A write that failed for a reason other than an outage: the batches are lost to
        # the index, so their seqs are not recorded and the worker must be resynced.
        self.failed = False
        self.clear_failed = False
        # Since when the index has deferred this writer's batches without moving on
        # (``SeqOp.follows``), and the rank position it showed then.
        self._deferred_since: float | None = None
        self._deferred_at = -1

    async def stage(self, rank: int, seq: int, batch: KVEventBatch, fingerprint: int = 0) -> None:
        """Queue ``batch``; writes when enough events are staged (else at ``flush``)."""
        self._staged.append((rank, seq, fingerprint, batch))
        self._staged_events += len(batch.events)
        if self._staged_events >= STAGE_EVENTS:
            await self.flush()

    async def flush(self) -> None:
        staged, n_events = self._staged, self._staged_events
        if not staged:
            return
        self._staged, self._staged_events = [], 0
        marks = []
        offset = 0
        before = dict(self.written)  # each batch names its predecessor (SeqOp.follows)
        for rank, seq, fp, b in staged:
            follows = before.get(rank, FOLLOWS_NOTHING)
            marks.append((offset, rank, seq, fp, follows))
            before[rank] = max(seq, follows)
            offset += len(b.events)
        if len(staged) == 1:
            merged = staged[0][3]
        else:
            last = staged[-1][3]
            events = [e for *_, b in staged for e in b.events]
            merged = KVEventBatch(last.ts, events, last.data_parallel_rank)
        got: dict[str, int] = {}

        async def write() -> None:
            got.update(await self._ingestor.apply_batch(self.worker_id, merged, marks))

        if not await self.retry.call(write):
            self.failed = True
            return
        self._counters.batches += len(staged)
        self._counters.events += n_events
        for rank, seq, _, _ in staged:
            self.written[rank] = max(seq, self.written.get(rank, seq))
        deferred = got.get(self.worker_id)
        if deferred is None:
            self._deferred_since = None
        elif self._deferred_since is None or deferred != self._deferred_at:
            self._deferred_since, self._deferred_at = time.monotonic(), deferred

    def deferred_for(self) -> float:
        """How long the index has deferred this writer's batches while standing still
        at one position (0 when it has not): another router that cleared the worker and
        rebuilds it should move it on; if it stopped midway, nothing does."""
        since = self._deferred_since
        return 0.0 if since is None else time.monotonic() - since

    async def persisted_seqs(self) -> dict[int, tuple[int, int]]:
        """Per rank, the last (seq, fingerprint) the index recorded for this worker."""
        got: dict[int, tuple[int, int]] = {}

        async def load() -> None:
            got.update(await self._ingestor.index.load_seqs(self.worker_id))

        await self.retry.call(load)
        return got

    async def holds_entries(self) -> bool:
        """True when the index holds blocks of this worker."""
        groups: dict[int, object] = {}

        async def load() -> None:
            groups.update(await self._ingestor.worker_groups(self.worker_id))

        await self.retry.call(load)
        return any(g.blocks_by_medium for g in groups.values())  # type: ignore[attr-defined]

    async def clear(self) -> None:
        """Write what is staged, then drop every entry of the worker."""
        await self.flush()
        self.written.clear()
        self._deferred_since = None
        if not await self.retry.call(self._ingestor.clear_worker, self.worker_id):
            self.clear_failed = True
