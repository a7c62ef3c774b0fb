"""``create_app``: the FastAPI application over a ``RouterService``.

Every error leaves as ``{"error": {"code", "message"}}`` - FastAPI's own 404/405/422,
our 401/404/409/413/503, and unexpected 500s alike - so clients need one error parser.
Every part of the API is imported statically: a part that fails to import or install
fails start-up, rather than a router that reports ready without ``/v1/route``.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from router.config import RouterSettings
from router.http import health, routing, scoring, stream, workers
from router.http.deps import ApiError
from router.http.ratelimit import ClientRateLimiter, RateLimitCollector, RateLimitMiddleware
from router.index import IndexUnavailable
from router.proxy import install as install_proxy
from router.ratelimited_log import RateLimitedLog
from router.service import RouterService, UnknownWorker
from schemas.rest import error_body

log = logging.getLogger(__name__)
_limited = RateLimitedLog(log)

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
    return JSONResponse(error_body(status, code, message), status_code=status, headers=headers)


def _validation_message(exc: RequestValidationError) -> str:
    parts = []
    for err in exc.errors()[:5]:
        loc = ".".join(str(p) for p in err.get("loc", ()) if p != "body") or "body"
        parts.append(f"{loc}: {err.get('msg', 'invalid')}")
    more = len(exc.errors()) - 5
    if more > 0:
        parts.append(f"... and {more} more")
    return "; ".join(parts) or "invalid request"


class ErrorCounts(Collector):
    """``kvroute_http_errors_total{code}``: error answers of the router's own endpoints.

    Bad input must be visible, not only answered: a client sending malformed bodies shows
    up here by error code (a bounded set). The proxied completions count theirs in
    ``kvroute_proxy_requests_total{outcome}``, and 429s in
    ``kvroute_http_rate_limited_total``.
    """

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(
            "kvroute_http_errors",
            "error answers (4xx/5xx) of the router's own endpoints, by error code",
            labels=["code"],
        )
        for code, n in sorted(self.counts.items()):
            family.add_metric([code], n)
        yield family


def _count(app: FastAPI, code: str) -> None:
    counts: ErrorCounts | None = getattr(app.state, "http_errors", None)
    if counts is not None:
        counts.counts[code] += 1


def _answer(
    request: Request,
    status: int,
    code: str,
    message: str,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    """The error answer, counted, and logged rate-limited (one key per code)."""
    _count(request.app, code)
    _limited.info(
        ("rejected", code),
        "%s %s answered %d %s: %s",
        request.method,
        request.url.path,
        status,
        code,
        message,
        extra={"event": "http_error", "code": code, "status": status},
    )
    return error_response(status, code, message, headers)


def install_error_handlers(app: FastAPI) -> None:
    app.state.http_errors = ErrorCounts()

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
        return _answer(request, exc.status, exc.code, exc.message, exc.headers)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = _CODES.get(exc.status_code, "error")
        message = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
        if exc.status_code == 404 and message == "Not Found":
            message = "no such endpoint"
        return _answer(request, exc.status_code, code, message, getattr(exc, "headers", None))

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        return _answer(request, 422, "invalid_request", _validation_message(exc))

    @app.exception_handler(UnknownWorker)
    async def _unknown_worker(request: Request, exc: UnknownWorker) -> JSONResponse:
        return _answer(request, 404, "unknown_worker", str(exc))

    @app.exception_handler(IndexUnavailable)
    async def _index_down(request: Request, exc: IndexUnavailable) -> JSONResponse:
        message = f"the index backend is unavailable: {exc}".rstrip(": ")
        return _answer(request, 503, "index_unavailable", message)

    @app.exception_handler(ClientDisconnect)
    async def _client_gone(request: Request, _: ClientDisconnect) -> JSONResponse:
        # The client left while sending its body: nobody reads this answer, but it is
        # counted (and no traceback is logged for a client's choice).
        return _answer(request, 400, "client_disconnected", "the client went away mid-request")


class InternalErrorMiddleware:
    """JSON 500 for an unexpected exception, logged with its traceback rate-limited.

    Starlette's own catch-all answers 500 and then re-raises, so the server logs every
    such request's traceback again, unthrottled; this layer sits inside it and ends the
    exception here. If the response had already started, the connection is closed.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def watch(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, watch)
        except Exception as exc:
            request = Request(scope)
            _limited.exception(
                ("internal", request.url.path, type(exc).__name__),
                "unhandled error on %s %s",
                request.method,
                request.url.path,
                extra={"event": "internal_error"},
            )
            _count(scope["app"], "internal_error")
            if not started:
                message = f"internal error: {type(exc).__name__}"
                await error_response(500, "internal_error", message)(scope, receive, send)


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
    try:
        svc.metrics.registry.register(app.state.http_errors)
    except ValueError:  # the same service behind a second app
        log.debug("http error metrics already registered")
    app.add_middleware(InternalErrorMiddleware)
    # A token needs at most ~12 JSON bytes; allow generous room for the other fields.
    app.add_middleware(
        BodyLimitMiddleware, max_bytes=svc.settings.max_request_tokens * 12 + (1 << 20)
    )
    app.include_router(health.router)
    app.include_router(workers.router)
    app.include_router(scoring.router)
    routing.install(app, svc)
    stream.install(app, svc)
    install_proxy(app, svc)  # the proxy routes with the routing extension's core
    settings = svc.settings
    if settings.client_rate_limit > 0:
        limiter = ClientRateLimiter(settings.client_rate_limit, settings.client_rate_burst)
        app.state.rate_limiter = limiter
        try:
            svc.metrics.registry.register(RateLimitCollector(limiter))
        except ValueError:  # the same service behind a second app
            log.debug("rate-limit metrics already registered")
        # Added last, so outermost: the proxied completions are limited too.
        app.add_middleware(RateLimitMiddleware, limiter=limiter)
    return app
