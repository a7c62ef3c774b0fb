"""The OpenAI-compatible proxy on the router's port (docs/proxy.md).

``install(app, service)`` is called by ``router.http.app.create_app`` after the routing
extension (the proxy routes with its ``RoutingCore``). ``outermost(app)`` is what
``kvroute serve`` hands to uvicorn: the proxied paths answered before FastAPI's own
middleware stack (error, telemetry and body-limit wrappers cost every request and every
``send``; the proxy does its own body limit and error answers).
"""

from __future__ import annotations

import logging

from fastapi import FastAPI
from starlette.types import ASGIApp

from router.http.ratelimit import RateLimitMiddleware
from router.proxy.core import Proxy, ProxyError
from router.proxy.endpoints import router
from router.proxy.forward import ProxyMiddleware
from router.proxy.metrics import ProxyCollector
from router.service import RouterService

__all__ = ["Proxy", "ProxyError", "install", "outermost"]


def install(app: FastAPI, service: RouterService) -> Proxy:
    proxy = Proxy(service)
    # httpx logs every request at INFO: per-request noise and cost on the hot path.
    logging.getLogger("httpx").setLevel(max(logging.WARNING, logging.getLogger().level))
    app.state.proxy = proxy
    service.proxy = proxy  # the dashboard summary reads it
    app.include_router(router)
    app.add_middleware(ProxyMiddleware, proxy=proxy)
    service.metrics.registry.register(ProxyCollector(proxy.counters, proxy.health))

    async def run() -> None:
        try:
            await proxy.health.run()
        finally:
            await proxy.close()

    service.add_background(run)
    return proxy


def outermost(app: FastAPI) -> ASGIApp:
    """``app`` with the proxy in front of everything (``app`` unchanged without one), and
    the per-client rate limit, when one is set, in front of the proxy: completions are
    requests of a client like any other (docs/security.md)."""
    proxy = getattr(app.state, "proxy", None)
    if proxy is None:
        return app
    front: ASGIApp = ProxyMiddleware(app, proxy=proxy)
    limiter = getattr(app.state, "rate_limiter", None)
    if limiter is not None:
        front = RateLimitMiddleware(front, limiter=limiter)
    return front
