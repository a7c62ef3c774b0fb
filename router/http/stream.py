"""Dashboard endpoints: ``GET /v1/stream`` (Server-Sent Events), ``GET /`` and ``/static``.

Installed by ``create_app`` when this module exists. The page is plain files shipped in
``router/static`` (no build step, nothing fetched from the internet); it subscribes to
``/v1/stream`` with ``EventSource`` and draws its charts in SVG.

Shutdown: uvicorn waits for open responses before running the app's lifespan shutdown,
and an SSE response never ends by itself, so the streams must be closed first -
``close_streams_on_exit(server, app)`` hooks that into a ``uvicorn.Server``; the service's
stop closes them too (for servers without the hook, set ``timeout_graceful_shutdown``).
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Depends, FastAPI
from fastapi.responses import FileResponse, StreamingResponse
from fastapi.staticfiles import StaticFiles
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from router.http.deps import ApiError, require_read_key
from router.http.errors import READ_KEY, error, responses
from router.http.hub import StreamHub, SummaryBuilder, TooManyClients

if TYPE_CHECKING:
    from collections.abc import Iterator

    import uvicorn

from router.service import RouterService

log = logging.getLogger(__name__)

STATIC_DIR = Path(__file__).resolve().parent.parent / "static"
SSE_HEADERS = {
    "Cache-Control": "no-cache",
    "X-Accel-Buffering": "no",  # nginx and friends: do not buffer the stream
}


class _StreamCollector(Collector):
    """``kvroute_stream_*``: how many dashboards listen, how many were dropped."""

    def __init__(self, hub: StreamHub) -> None:
        self._hub = hub

    def collect(self) -> Iterator[Metric]:
        hub = self._hub
        yield GaugeMetricFamily(
            "kvroute_stream_clients", "connected /v1/stream clients", value=hub.clients
        )
        yield CounterMetricFamily(
            "kvroute_stream_dropped_clients",
            "stream clients dropped for falling a full queue behind",
            value=hub.dropped,
        )
        yield CounterMetricFamily(
            "kvroute_stream_refused_clients",
            "stream clients refused with 503 because --stream-max-clients were connected",
            value=hub.refused,
        )
        yield CounterMetricFamily(
            "kvroute_stream_summaries",
            "dashboard summaries computed (one per tick while clients listen)",
            value=hub.computations,
        )


def install(app: FastAPI, service: RouterService, *, period_s: float | None = None) -> StreamHub:
    """Add the stream, the page and its assets to ``app``; returns the hub."""
    if period_s is None:
        period_s = service.settings.stream_period_s
    settings = service.settings
    hub = StreamHub(
        SummaryBuilder(service).build,
        period_s=period_s,
        max_clients=settings.stream_max_clients,
        queue_size=settings.stream_queue_size,
    )
    app.state.stream_hub = hub
    try:
        service.metrics.registry.register(_StreamCollector(hub))
    except ValueError:  # the same service behind a second app: its first hub is exported
        log.debug("stream metrics already registered")

    async def close_at_stop() -> None:
        try:
            await asyncio.Event().wait()  # until the service stops and cancels us
        finally:
            await hub.close()

    service.add_background(close_at_stop)

    router = APIRouter(tags=["dashboard"])

    @router.get(
        "/v1/stream",
        summary="live summaries for dashboards (Server-Sent Events, `event: summary`)",
        response_class=StreamingResponse,
        responses={
            200: {"content": {"text/event-stream": {}}},
            **responses(READ_KEY, error(503, "too many stream clients")),
        },
        dependencies=[Depends(require_read_key)],
    )
    async def stream() -> StreamingResponse:
        try:
            sub = hub.subscribe()
        except TooManyClients as exc:
            raise ApiError(503, "too_many_clients", str(exc)) from None
        return StreamingResponse(
            hub.stream(sub), media_type="text/event-stream", headers=SSE_HEADERS
        )

    @router.get("/", include_in_schema=False)
    async def dashboard() -> FileResponse:
        return FileResponse(STATIC_DIR / "index.html", headers={"Cache-Control": "no-cache"})

    app.include_router(router)
    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")
    return hub


def close_streams_on_exit(server: uvicorn.Server, app: FastAPI) -> None:
    """Make ``server``'s signal handler end every SSE stream first, so shutdown is prompt."""
    hub: StreamHub | None = getattr(app.state, "stream_hub", None)
    if hub is None:
        return
    original = server.handle_exit

    def handle_exit(sig: int, frame: Any) -> None:
        close_streams_soon(hub)
        original(sig, frame)

    server.handle_exit = handle_exit  # type: ignore[method-assign]


def close_streams_soon(hub: StreamHub) -> None:
    """Schedule ``hub.close()`` on its event loop; callable from a signal handler or thread."""
    loop = hub.loop
    if loop is None or loop.is_closed():
        return
    loop.call_soon_threadsafe(lambda: loop.create_task(hub.close()))
