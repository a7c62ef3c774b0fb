"""Which workers may take traffic, and why not.

A worker is *live* when its KV event stream is connected (else the router would route
on a stale or empty view of its cache) and its HTTP endpoint answers ``GET /health``.
Each worker is checked once every ``health_interval_s``, the checks spread evenly over
the interval (checking 64 workers at once stalled the event loop for tens of ms every
interval: that burst was the proxy's p99 at 64 workers, docs/proxy.md); a new worker, or
one taken out, is checked at once. ``health_failures`` failed checks in a row take a
worker out, one success brings it back. A connect error while forwarding takes it out
at once (a dead engine must not get the next request too); the next good check restores
it. The served models are read once from the engine's ``/v1/models`` when the worker spec
does not name one.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import msgspec

from router.logging_setup import event_extra
from router.proxy.upstream import UpstreamError, UpstreamPool

if TYPE_CHECKING:
    from router.service import RouterService

log = logging.getLogger(__name__)

STREAM_OK = frozenset({"connected", "resyncing"})
_decode = msgspec.json.Decoder()


@dataclass(slots=True)
class WorkerHealth:
    """HTTP health of one worker, as the proxy last saw it."""

    http_ok: bool | None = None  # None: not checked yet
    reason: str = "HTTP health not checked yet"
    checks: int = 0
    failed_checks: int = 0
    consecutive_failures: int = 0
    forward_failures: int = 0
    last_ok: float | None = None
    models: frozenset[str] | None = None  # discovered from /v1/models; None = unknown
    # The engine's model cards (id -> card as it answered: max_model_len, root, ...).
    cards: dict[str, dict[str, object]] = field(default_factory=dict)
    transitions: int = 0
    down_since: float | None = field(default=None)


class HealthMonitor:
    """Periodic HTTP checks of every registered worker with an ``http_endpoint``."""

    def __init__(
        self,
        service: RouterService,
        upstream: UpstreamPool,
        *,
        interval_s: float,
        timeout_s: float,
        failures: int,
        require_events: bool = True,
    ) -> None:
        self.service = service
        self.upstream = upstream
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.failures = max(1, failures)
        self.require_events = require_events
        self.workers: dict[str, WorkerHealth] = {}
        self._wake = asyncio.Event()

    def health(self, worker_id: str) -> WorkerHealth:
        h = self.workers.get(worker_id)
        if h is None:
            h = self.workers[worker_id] = WorkerHealth()
            self._wake.set()  # a new worker: check it now rather than at the next tick
        return h

    def why_not_live(self, worker_id: str) -> str | None:
        """None when the worker may take traffic, else the reason it may not."""
        sub = self.service.subscriptions.get(worker_id)
        if sub is None:
            return "not registered"
        if sub.spec.http_endpoint is None:
            return "no http endpoint registered (http=URL in the worker spec)"
        if self.require_events and sub.state not in STREAM_OK:
            if sub.state == "connecting":
                return f"KV event stream never connected ({sub.spec.endpoint})"
            return f"KV event stream {sub.state} ({sub.spec.endpoint})"
        h = self.health(worker_id)
        if not h.http_ok:
            return h.reason
        return None

    def _set(self, worker_id: str, h: WorkerHealth, ok: bool, reason: str) -> None:
        was = h.http_ok
        if ok:
            h.http_ok, h.reason, h.consecutive_failures = True, "", 0
            h.last_ok, h.down_since = time.time(), None
        else:
            h.consecutive_failures += 1
            if was is None or h.consecutive_failures >= self.failures:
                h.http_ok, h.reason = False, reason
                h.down_since = h.down_since or time.time()
        if was is not None and was != h.http_ok:
            h.transitions += 1
            state = "healthy" if h.http_ok else "unhealthy"
            log.warning(
                "worker %s is %s%s",
                worker_id,
                state,
                f": {reason}" if reason else "",
                extra=event_extra(f"worker_{state}", worker=worker_id, reason=reason),
            )

    def forward_failed(self, worker_id: str, reason: str) -> None:
        """A connect error while forwarding: out of routing until a check passes."""
        h = self.health(worker_id)
        h.forward_failures += 1
        h.consecutive_failures = self.failures - 1
        self._set(worker_id, h, False, f"forwarding failed: {reason}")
        self._wake.set()

    async def check(self, worker_id: str) -> None:
        sub = self.service.subscriptions.get(worker_id)
        if sub is None or sub.spec.http_endpoint is None:
            return
        base = sub.spec.http_endpoint.rstrip("/")
        h = self.health(worker_id)
        h.checks += 1
        try:
            status, _ = await self.upstream.get(f"{base}/health", self.timeout_s)
            ok, reason = status == 200, f"GET /health answered {status}"
            if ok and h.models is None and sub.spec.model is None:
                h.models, h.cards = await self._models(base)
        except UpstreamError as exc:
            ok, reason = False, f"GET /health failed: {exc}"
        if not ok:
            h.failed_checks += 1
        self._set(worker_id, h, ok, reason)

    async def _models(
        self, base: str
    ) -> tuple[frozenset[str] | None, dict[str, dict[str, object]]]:
        """The served model names and the engine's cards for them (None, {}: unknown)."""
        try:
            status, body = await self.upstream.get(f"{base}/v1/models", self.timeout_s)
            data = _decode.decode(body).get("data") if status == 200 else None
            if isinstance(data, list):
                cards = {str(m["id"]): m for m in data if isinstance(m, dict) and "id" in m}
                return frozenset(cards), cards
        except (UpstreamError, msgspec.DecodeError, AttributeError):
            pass
        return None, {}

    def _prune(self) -> list[str]:
        ids = self.service.worker_ids()
        for gone in set(self.workers) - set(ids):
            del self.workers[gone]
        return ids

    async def check_all(self) -> None:
        """Every worker now, concurrently (start-up and tests; ``run`` spreads them)."""
        await asyncio.gather(*(self.check(w) for w in self._prune()))

    async def run(self) -> None:
        """One check per worker per interval, one every ``interval / workers`` seconds;
        a wake-up (new worker, forward failure) checks every worker not known healthy
        at once. A check that hangs does not hold up the others (each is a task; at most
        one per worker at a time)."""
        busy: dict[str, asyncio.Task[None]] = {}

        def done(worker_id: str, task: asyncio.Task[None]) -> None:
            busy.pop(worker_id, None)
            if not task.cancelled() and task.exception() is not None:
                log.error("health check of %s failed", worker_id, exc_info=task.exception())

        def launch(worker_id: str) -> None:
            if worker_id not in busy:
                task = busy[worker_id] = asyncio.create_task(self.check(worker_id))
                task.add_done_callback(functools.partial(done, worker_id))

        try:
            while True:
                ids = self._prune()
                if not ids:
                    await self._pause(self.interval_s)
                    continue
                step = self.interval_s / len(ids)
                for worker_id in ids:
                    launch(worker_id)
                    if await self._pause(step):
                        for w in self.service.worker_ids():
                            if not self.health(w).http_ok:
                                launch(w)
        finally:
            for task in list(busy.values()):
                task.cancel()

    async def _pause(self, seconds: float) -> bool:
        """Sleep ``seconds``; True (early, after a short coalescing pause) when woken."""
        try:
            await asyncio.wait_for(self._wake.wait(), seconds)
        except TimeoutError:
            return False
        await asyncio.sleep(min(0.05, self.interval_s))  # coalesce wake-ups
        self._wake.clear()
        return True
