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
    settings: Any

    async def restore_worker(self, worker_id: str) -> None: ...

    async def remove_worker(self, worker_id: str) -> None: ...


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
        if len(lost) < len(subs):  # the index kept others: removed elsewhere, or lost?
            lost = await self._drop_removed_elsewhere(lost)
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

    async def _drop_removed_elsewhere(self, missing: list[Any]) -> list[Any]:
        """Of the workers the index no longer knows while it knows others, those
        registered over REST whose shared registration is gone too were deleted through
        another router sharing the index: drop them here as well (restoring them
        re-created what the operator deleted, and resynced every worker). The rest are
        content lost (returned)."""
        svc = self.service
        kept = await svc.index.load_registrations()
        configured = {spec.worker_id for spec in svc.settings.workers}
        lost = []
        for sub in missing:
            if sub.worker_id in configured or sub.worker_id in kept or sub.spec.via_listener:
                lost.append(sub)
                continue
            log.info(
                "worker %s was removed through another router sharing the index: removed here",
                sub.worker_id,
                extra=event_extra("worker_removed_elsewhere", worker=sub.worker_id),
            )
            await svc.remove_worker(sub.worker_id)
        return lost
