"""``create_app``: the FastAPI application over a ``RouterService``.

Every error leaves as ``{"error": {"code", "message"}}`` - FastAPI's own 404/405/422,
our 401/404/409/413/503, and unexpected 500s alike - so clients need one error parser.
Every part of the API is imported statically: a part that fails to import or install
fails start-up, rather than a router that reports ready without ``/v1/route``.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from router.config import RouterSettings
from router.http import health, routing, scoring, stream, workers
from router.http.deps import ApiError
from router.http.ratelimit import ClientRateLimiter, RateLimitCollector, RateLimitMiddleware
from router.index import IndexUnavailable
from router.proxy import install as install_proxy
from router.service import RouterService, UnknownWorker

log = logging.getLogger(__name__)

_CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    409: "conflict",
    413: "payload_too_large",
    415: "unsupported_media_type",
    422: "invalid_request",
    429: "too_many_requests",
    500: "internal_error",
    503: "unavailable",
}


def error_response(
    status: int, code: str, message: str, headers: dict[str, str] | None = None
) -> JSONResponse:
    return JSONResponse(
        {"error": {"code": code, "message": message}}, status_code=status, headers=headers
    )


def _validation_message(exc: RequestValidationError) -> str:
    parts = []
    for err in exc.errors()[:5]:
        loc = ".".join(str(p) for p in err.get("loc", ()) if p != "body") or "body"
        parts.append(f"{loc}: {err.get('msg', 'invalid')}")
    more = len(exc.errors()) - 5
    if more > 0:
        parts.append(f"... and {more} more")
    return "; ".join(parts) or "invalid request"


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def _api_error(_: Request, exc: ApiError) -> JSONResponse:
        return error_response(exc.status, exc.code, exc.message, exc.headers)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = _CODES.get(exc.status_code, "error")
        message = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
        if exc.status_code == 404 and message == "Not Found":
            message = "no such endpoint"
        return error_response(exc.status_code, code, message, getattr(exc, "headers", None))

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(422, "invalid_request", _validation_message(exc))

    @app.exception_handler(UnknownWorker)
    async def _unknown_worker(_: Request, exc: UnknownWorker) -> JSONResponse:
        return error_response(404, "unknown_worker", str(exc))

    @app.exception_handler(IndexUnavailable)
    async def _index_down(_: Request, exc: IndexUnavailable) -> JSONResponse:
        return error_response(
            503, "index_unavailable", f"the index backend is unavailable: {exc}".rstrip(": ")
        )

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return error_response(500, "internal_error", f"internal error: {type(exc).__name__}")


class BodyLimitMiddleware:
    """413 for a body larger than ``max_bytes``, however it is sent.

    A declared ``Content-Length`` above the limit is refused before reading. A body
    without one (``Transfer-Encoding: chunked``) is read here as it streams, counting
    bytes, and refused as soon as it passes the limit; below it, it is handed on
    unchanged. So at most ``max_bytes`` of any request is ever held. Pure ASGI (no
    per-request task) so the score hot path pays one header lookup.
    """

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    def _too_large(self, size: str) -> JSONResponse:
        return error_response(
            413, "payload_too_large", f"request body of {size} bytes exceeds {self.max_bytes}"
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                if value.isdigit() and int(value) > self.max_bytes:
                    await self._too_large(str(int(value)))(scope, receive, send)
                    return
                await self.app(scope, receive, send)  # the server enforces the length
                return
        if scope.get("method") in ("GET", "HEAD", "OPTIONS"):
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await self._too_large(f"more than {self.max_bytes}")(scope, receive, send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        chunks.clear()
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # e.g. http.disconnect for a streaming response

        await self.app(scope, replay, send)


def create_app(
    service: RouterService | None = None, settings: RouterSettings | None = None
) -> FastAPI:
    """Build the app; its lifespan starts and stops ``service`` (built from ``settings``)."""
    if service is None:
        service = RouterService(settings)
    svc = service

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await svc.start()
        if not await svc.ready():  # loud at start-up, not only on the first 503
            log.warning(
                "the %s index backend does not answer at start-up%s; /readyz and /v1/score "
                "answer 503 until it does",
                svc.index.kind,
                f" ({svc.settings.redis_url})" if svc.index.kind == "redis" else "",
                extra={"event": "index_unreachable"},
            )
        try:
            yield
        finally:
            await svc.stop()

    app = FastAPI(
        title="kvroute router",
        summary="KV-cache-aware scoring and routing for LLM inference fleets",
        version="1",
        lifespan=lifespan,
        docs_url="/docs",
    )
    app.state.service = svc
    install_error_handlers(app)
    # A token needs at most ~12 JSON bytes; allow generous room for the other fields.
    app.add_middleware(
        BodyLimitMiddleware, max_bytes=svc.settings.max_request_tokens * 12 + (1 << 20)
    )
    settings = svc.settings
    if settings.client_rate_limit > 0:
        limiter = ClientRateLimiter(settings.client_rate_limit, settings.client_rate_burst)
        app.state.rate_limiter = limiter
        try:
            svc.metrics.registry.register(RateLimitCollector(limiter))
        except ValueError:  # the same service behind a second app
            log.debug("rate-limit metrics already registered")
        app.add_middleware(RateLimitMiddleware, limiter=limiter)
    app.include_router(health.router)
    app.include_router(workers.router)
    app.include_router(scoring.router)
    routing.install(app, svc)
    stream.install(app, svc)
    install_proxy(app, svc)  # the proxy routes with the routing extension's core
    return app
