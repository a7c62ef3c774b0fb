"""Which workers may take traffic, and why not.

A worker is *live* when its KV event stream is connected (else the router would route
on a stale or empty view of its cache) and its HTTP endpoint answers ``GET /health``.
Checks run every ``health_interval_s``; ``health_failures`` failed checks in a row take
a worker out, one success brings it back. A connect error while forwarding takes it out
at once (a dead engine must not get the next request too); the next good check restores
it. The served models are read once from the engine's ``/v1/models`` when the worker spec
does not name one.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import httpx

from router.logging_setup import event_extra

if TYPE_CHECKING:
    from router.service import RouterService

log = logging.getLogger(__name__)

STREAM_OK = frozenset({"connected", "resyncing"})


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
    transitions: int = 0
    down_since: float | None = field(default=None)


class HealthMonitor:
    """Periodic HTTP checks of every registered worker with an ``http_endpoint``."""

    def __init__(
        self,
        service: RouterService,
        client: httpx.AsyncClient,
        *,
        interval_s: float,
        timeout_s: float,
        failures: int,
        require_events: bool = True,
    ) -> None:
        self.service = service
        self.client = client
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
            r = await self.client.get(f"{base}/health", timeout=self.timeout_s)
            ok, reason = r.status_code == 200, f"GET /health answered {r.status_code}"
            if ok and h.models is None and sub.spec.model is None:
                h.models = await self._models(base)
        except httpx.HTTPError as exc:
            ok, reason = False, f"GET /health failed: {type(exc).__name__}: {exc}".rstrip(": ")
        if not ok:
            h.failed_checks += 1
        self._set(worker_id, h, ok, reason)

    async def _models(self, base: str) -> frozenset[str] | None:
        try:
            r = await self.client.get(f"{base}/v1/models", timeout=self.timeout_s)
            data = r.json().get("data") if r.status_code == 200 else None
            if isinstance(data, list):
                return frozenset(str(m["id"]) for m in data if isinstance(m, dict) and "id" in m)
        except (httpx.HTTPError, ValueError, AttributeError):
            pass
        return None

    async def check_all(self) -> None:
        ids = self.service.worker_ids()
        for gone in set(self.workers) - set(ids):
            del self.workers[gone]
        await asyncio.gather(*(self.check(w) for w in ids))

    async def run(self) -> None:
        while True:
            self._wake.clear()
            await self.check_all()
            try:
                await asyncio.wait_for(self._wake.wait(), self.interval_s)
                await asyncio.sleep(min(0.05, self.interval_s))  # coalesce wake-ups
            except TimeoutError:
                pass
