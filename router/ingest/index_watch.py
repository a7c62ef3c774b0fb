"""Noticing a shared index that lost its content, and repairing every worker.

Why: a Redis restarted without persistence (or flushed) comes back empty; the router's
connections recover, ``/readyz`` turns green again, and without this every estimate
would silently drop to 0 -- or worse, later stores would chain onto nothing. Every
registered worker keeps its metadata in the index from registration on, so a worker the
index no longer knows means the content is gone: the router counts it, logs it, saves
the registrations and settings again, and resyncs each worker from its publisher's
replay buffer (estimates are lower bounds where the buffer does not reach back to seq 0,
shown as ``partial_history``).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any, Protocol

from router.index.base import IndexUnavailable
from router.logging_setup import event_extra
from router.ratelimited_log import RateLimitedLog

if TYPE_CHECKING:
    from router.index.base import IndexBackend


class WatchedService(Protocol):
    """What the watch needs of the router: its subscriptions, its index, and a way to
    save a worker's registration and settings again."""

    subscriptions: Any
    index: IndexBackend

    async def restore_worker(self, worker_id: str) -> None: ...


log = logging.getLogger(__name__)
_limited = RateLimitedLog(log)


class IndexWatch:
    """Polls the index for the registered workers' metadata (one call per check)."""

    def __init__(self, service: WatchedService, every_s: float) -> None:
        self.service = service
        self.every_s = every_s
        self.losses = 0  # times the index was found without our workers
        self.errors = 0  # checks that failed other than by an outage (logged, retried)

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.every_s)
            try:
                await self.check()
            except IndexUnavailable:
                continue  # an outage: the writers retry, /readyz says 503
            except Exception:  # e.g. a wrong-typed key: the watch must outlive it
                self.errors += 1
                _limited.exception(
                    "check_failed",
                    "index watch: a check failed (%d so far); checking again in %.1f s",
                    self.errors,
                    self.every_s,
                    extra=event_extra("index_watch_failed"),
                )

    async def check(self) -> bool:
        """True when the index had lost content (and the repair was started)."""
        svc = self.service
        subs = svc.subscriptions.all()
        if not subs:
            return False
        known = set(await svc.index.known_workers())
        lost = [s for s in subs if s.worker_id not in known]
        if not lost:
            return False
        self.losses += 1
        log.warning(
            "the index lost its content (%d of %d workers unknown to it: restarted empty or "
            "flushed?); re-registering and resyncing from the publishers",
            len(lost),
            len(subs),
            extra=event_extra("index_lost", workers=len(lost)),
        )
        for sub in subs:
            await svc.restore_worker(sub.worker_id)
            sub.request_resync("the index lost its content")
        return True
