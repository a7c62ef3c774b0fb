"""HTTP face of the simulated engine: a vLLM-like ``/v1/completions`` over ``SimEngine``.

Requests run one at a time (an asyncio lock) in a worker thread, so the event order is
exact and the event loop stays free for ``/health`` while torch copies run.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import zmq
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, StrictInt
from starlette.exceptions import HTTPException as StarletteHTTPException

from offload_core.engine import EngineConfig, SimEngine
from offload_core.groups import format_groups
from offload_core.kv_cache import RequestTooLargeError
from publisher import EventPublisher, KVEventsConfig, make_publisher

log = logging.getLogger("kvroute.engine")

MAX_TOKEN_ID = 2**31 - 1


class CompletionRequest(BaseModel):
    """The subset of vLLM's completion request the simulation uses; other fields are
    accepted and ignored, as a client may send them."""

    model_config = ConfigDict(extra="allow")

    prompt: list[StrictInt] = Field(min_length=1, description="prompt token ids")
    model: str | None = None
    max_tokens: int = Field(default=1, ge=0, le=1_000_000)
    lora_name: str | None = Field(default=None, max_length=256)
    cache_salt: str | None = Field(default=None, max_length=1024)


def _error(status: int, code: str, message: str) -> JSONResponse:
    return JSONResponse({"error": {"code": code, "message": message}}, status_code=status)


def create_app(engine: SimEngine) -> FastAPI:
    lock = asyncio.Lock()
    wid = engine.config.worker_id

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        log.info("worker %s: HTTP up", wid)
        yield
        log.info("worker %s: HTTP stopping", wid)

    app = FastAPI(title=f"kvroute engine {wid}", lifespan=lifespan)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ()))
        return _error(422, "invalid_request", f"{where}: {first.get('msg', 'invalid')}")

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return _error(exc.status_code, "http_error", str(exc.detail))

    @app.get("/health")
    @app.get("/healthz")
    async def health() -> dict[str, str]:
        return {"status": "ok", "worker_id": wid}

    @app.get("/stats")
    async def stats() -> dict[str, Any]:
        async with lock:  # the engine's dicts change while a request runs in its thread
            return engine.stats_dict()

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest) -> JSONResponse:
        if any(t < 0 or t > MAX_TOKEN_ID for t in body.prompt):
            return _error(422, "invalid_request", "prompt: token ids must be in [0, 2**31)")
        async with lock:
            try:
                res = await asyncio.to_thread(
                    engine.serve, body.prompt, body.cache_salt, body.lora_name
                )
            except RequestTooLargeError as exc:
                return _error(400, "prompt_too_long", str(exc))
        completion = body.max_tokens
        return JSONResponse(
            {
                "id": f"cmpl-{uuid.uuid4().hex}",
                "object": "text_completion",
                "created": int(time.time()),
                "model": body.model or wid,
                "choices": [{"index": 0, "text": "", "logprobs": None, "finish_reason": "length"}],
                "usage": {
                    "prompt_tokens": res.prompt_tokens,
                    "completion_tokens": completion,
                    "total_tokens": res.prompt_tokens + completion,
                    "prompt_tokens_details": {"cached_tokens": res.cached_tokens},
                },
                "kv": {
                    "worker_id": wid,
                    "gpu_cached_tokens": res.gpu_cached_tokens,
                    "loaded_blocks": res.loaded_blocks,
                    "offloaded_blocks": res.offloaded_blocks,
                    "computed_blocks": res.computed_blocks,
                },
            }
        )

    @app.post("/reset_prefix_cache")
    async def reset_prefix_cache() -> JSONResponse:
        async with lock:
            ok = await asyncio.to_thread(engine.reset_prefix_cache)
        if not ok:
            return _error(409, "blocks_in_use", "blocks are in use; try again")
        return JSONResponse({"reset": True})

    return app


def engine_publisher(endpoint: str | None, replay: str | None, topic: str) -> EventPublisher:
    """The engine's publisher: ZMQ with replay, or nothing when ``endpoint`` is empty."""
    config = KVEventsConfig(
        enable_kv_cache_events=bool(endpoint),
        endpoint=endpoint or "tcp://*:5557",
        replay_endpoint=replay or None,
        topic=topic,
    )
    return make_publisher(config)


def run_server(
    config: EngineConfig,
    host: str,
    port: int,
    publish: str | None,
    replay: str | None,
    topic: str,
) -> int:
    """Run ``kvroute engine`` until interrupted."""
    import uvicorn

    try:
        publisher = engine_publisher(publish, replay, topic)
    except (zmq.ZMQError, ValueError) as exc:
        log.error("worker %s: cannot open %s / %s: %s", config.worker_id, publish, replay, exc)
        return 1
    engine = SimEngine(config, publisher)
    endpoints = getattr(publisher, "bound_endpoint", None)
    log.info(
        "worker %s: groups %s, %d GPU blocks, %d CPU blocks (%s), device %s, "
        "publishing on %s (replay %s, topic %r), HTTP on http://%s:%d",
        config.worker_id,
        format_groups(engine.groups),
        config.gpu_blocks,
        config.cpu_blocks,
        config.cpu_policy,
        engine.buffers.device,
        endpoints or "nothing",
        getattr(publisher, "bound_replay_endpoint", None),
        topic,
        host,
        port,
    )
    try:
        uvicorn.run(create_app(engine), host=host, port=port, log_level="warning")
    finally:
        engine.shutdown()
        log.info("worker %s: stopped", config.worker_id)
    return 0
