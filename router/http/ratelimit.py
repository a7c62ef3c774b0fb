"""Per-client request rates: a token bucket per client address, in front of every endpoint.

One client (a buggy load generator, a scraper in a loop) must not be able to take the
router's event loop away from the others. Each client address gets a bucket of
``burst`` requests refilled at ``rate`` per second; a request finding it empty gets 429
``rate_limited`` with ``Retry-After`` and is counted. Probes and scrapes (``/healthz``,
``/readyz``, ``/metrics``) are never limited, so a throttled client cannot make the
router look down. The table of buckets is bounded (least recently seen clients are
forgotten, which only ever gives them a full bucket back). ``rate = 0`` turns it off.
Pure ASGI: the score hot path pays one dict lookup and a little arithmetic.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Iterator

from fastapi.responses import JSONResponse
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector
from starlette.types import ASGIApp, Receive, Scope, Send

from schemas.rest import error_body

EXEMPT_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})
# Set in the ASGI scope once a request has been charged: ``router.proxy.outermost`` puts a
# second copy of the middleware in front of the proxy, and a request must pay once.
_CHECKED = "kvroute.rate_checked"
MAX_CLIENTS = 10_000


class ClientRateLimiter:
    """Token buckets keyed by client address; ``allow`` answers the wait, 0 when allowed."""

    def __init__(self, rate: float, burst: int, max_clients: int = MAX_CLIENTS) -> None:
        self.rate = rate
        self.burst = max(1, burst)
        self.max_clients = max_clients
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()
        self.limited = 0  # requests refused so far (a metric)

    def __len__(self) -> int:
        return len(self._buckets)

    def allow(self, client: str, now: float | None = None) -> float:
        """0.0 when ``client`` may go on (a token is spent), else seconds until it may."""
        now = time.monotonic() if now is None else now
        buckets = self._buckets
        tokens, last = buckets.pop(client, (float(self.burst), now))
        tokens = min(float(self.burst), tokens + (now - last) * self.rate)
        if tokens >= 1.0:
            buckets[client] = (tokens - 1.0, now)
            wait = 0.0
        else:
            buckets[client] = (tokens, now)
            self.limited += 1
            wait = (1.0 - tokens) / self.rate
        if len(buckets) > self.max_clients:
            buckets.popitem(last=False)
        return wait


class RateLimitCollector(Collector):
    """``kvroute_http_rate_limited_total``."""

    def __init__(self, limiter: ClientRateLimiter) -> None:
        self._limiter = limiter

    def collect(self) -> Iterator[Metric]:
        yield CounterMetricFamily(
            "kvroute_http_rate_limited",
            "requests refused with 429 because their client exceeded --client-rate-limit",
            value=self._limiter.limited,
        )


class RateLimitMiddleware:
    """429 for a client over its rate (see the module docstring)."""

    def __init__(self, app: ASGIApp, limiter: ClientRateLimiter) -> None:
        self.app = app
        self.limiter = limiter

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] != "http"
            or scope.get("path") in EXEMPT_PATHS
            or scope.get(_CHECKED)  # already charged by an outer copy of this layer
        ):
            await self.app(scope, receive, send)
            return
        scope[_CHECKED] = True
        client = scope.get("client")
        wait = self.limiter.allow(client[0] if client else "")
        if wait <= 0.0:
            await self.app(scope, receive, send)
            return
        why = f"more than {self.limiter.rate:g} requests/s from this client; retry in {wait:.2f} s"
        response = JSONResponse(
            error_body(429, "rate_limited", why),
            status_code=429,
            headers={"Retry-After": str(max(1, math.ceil(wait)))},
        )
        await response(scope, receive, send)
