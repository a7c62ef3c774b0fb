"""Index writes that survive an index outage: keep the batch, back off, report the lag.

Every ingest operation is idempotent, so retrying a half-applied batch is safe; the
subscriber stalls (frames wait in its SUB queue, and a replay recovers any it drops)
instead of skipping data, and ``lag_seconds`` shows how long it has been stuck.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Protocol

from router.config import RouterSettings
from router.index.base import IndexUnavailable
from router.logging_setup import event_extra

log = logging.getLogger("router.subscriber")


class RetryCounters(Protocol):
    ingest_retries: int
    ingest_errors: int


class IndexRetry:
    """Per worker: run index calls until the index takes them."""

    def __init__(self, worker_id: str, settings: RouterSettings, counters: RetryCounters) -> None:
        self.worker_id = worker_id
        self.counters = counters
        self.retrying_since: float | None = None
        self._initial = settings.ingest_retry_initial_s
        self._max = settings.ingest_retry_max_s

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
                if self.counters.ingest_errors == 1:
                    log.exception("worker %s: ingest failed; batch skipped", self.worker_id)
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
