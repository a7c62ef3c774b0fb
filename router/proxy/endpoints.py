"""The proxy's plain endpoints: ``/v1/models``, ``/tokenize``/``/detokenize`` pass-through,
and ``/v1/proxy/workers`` (who takes traffic, and why not)."""

from __future__ import annotations

import time
from typing import Any

import httpx
from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response

from router.http.deps import ApiError, require_read_key, require_write_key
from router.proxy.core import Proxy, ProxyError
from router.proxy.headers import forwarded

router = APIRouter(tags=["openai"])


def _proxy(request: Request) -> Proxy:
    return request.app.state.proxy


@router.get(
    "/v1/models",
    summary="the union of the models the registered workers serve",
    dependencies=[Depends(require_read_key)],
)
async def models(request: Request) -> dict[str, Any]:
    """Each model's card as an engine gave it (so clients keep ``max_model_len`` and the
    rest), else a minimal one for a model named only in a worker spec."""
    now = int(time.time())
    p = _proxy(request)
    data = []
    for m in p.models():
        card = p.model_card(m)
        data.append(card or {"id": m, "object": "model", "created": now, "owned_by": "kvroute"})
    return {"object": "list", "data": data}


@router.get(
    "/v1/proxy/workers",
    summary="per worker: live or not (and why), routed, accuracy",
    dependencies=[Depends(require_read_key)],
)
async def proxy_workers(request: Request) -> dict[str, Any]:
    p = _proxy(request)
    out = [{"worker_id": w, **p.worker_view(w)} for w in p.service.worker_ids()]
    return {"workers": out}


async def _pass_through(request: Request, path: str) -> Response:
    p = _proxy(request)
    raw = await request.body()
    try:
        body = await request.json()
    except (ValueError, RecursionError):  # ValueError covers invalid UTF-8 too
        raise ApiError(400, "invalid_json", "request body is not valid JSON") from None
    model = body.get("model") if isinstance(body, dict) else None
    try:
        workers = p.candidates(model if isinstance(model, str) else None)
    except ProxyError as exc:
        raise ApiError(exc.status, exc.code, exc.message) from None
    # The engines' own key, when set, is the client's default header: the client's goes.
    keyed = bool(p.settings.api_key or p.settings.engine_api_key)
    headers = [*forwarded(request.headers.raw, keyed), (b"content-type", b"application/json")]
    # Not a cache decision: the least busy live worker answers.
    inflight = p.core.inflight_by_worker()
    for worker in sorted(workers, key=lambda w: inflight.get(w, 0)):
        try:
            r = await p.client.post(p.endpoint(worker) + path, content=raw, headers=headers)
        except httpx.HTTPError:
            continue
        return Response(
            r.content,
            status_code=r.status_code,
            media_type=r.headers.get("content-type"),
            headers={"x-kvroute-worker": worker},
        )
    raise ApiError(502, "upstream_failed", f"no worker answered {path}")


@router.post(
    "/tokenize",
    summary="pass-through to a live worker serving the body's model",
    dependencies=[Depends(require_read_key)],
)
async def tokenize(request: Request) -> Response:
    return await _pass_through(request, "/tokenize")


@router.post(
    "/detokenize",
    summary="pass-through to a live worker serving the body's model",
    dependencies=[Depends(require_read_key)],
)
async def detokenize(request: Request) -> Response:
    return await _pass_through(request, "/detokenize")


async def _engine_work(request: Request) -> Response:
    return await _pass_through(request, request.url.path)


for _path, _what in (
    ("/v1/embeddings", "OpenAI embeddings"),
    ("/v1/rerank", "rerank (Jina/Cohere style, as vLLM serves it)"),
    ("/rerank", "rerank (vLLM's unversioned path)"),
):
    router.add_api_route(
        _path,
        _engine_work,
        methods=["POST"],
        summary=f"{_what}: passed to the least busy live worker serving the body's model",
        # Engine work, like completions: the key whenever one is set.
        dependencies=[Depends(require_write_key)],
    )


@router.post(
    "/v1/completions",
    summary="OpenAI completions, routed to the worker with the best cache hit (streaming too)",
    include_in_schema=True,
    # Documents the rule; the middleware answers first and checks the key itself.
    dependencies=[Depends(require_write_key)],
)
async def completions_doc() -> JSONResponse:  # pragma: no cover - the middleware answers
    raise AssertionError("served by router.proxy.forward.ProxyMiddleware")


@router.post(
    "/v1/chat/completions",
    summary="OpenAI chat completions, routed like /v1/completions (chat template applied)",
    dependencies=[Depends(require_write_key)],
)
async def chat_doc() -> JSONResponse:  # pragma: no cover - the middleware answers
    raise AssertionError("served by router.proxy.forward.ProxyMiddleware")
