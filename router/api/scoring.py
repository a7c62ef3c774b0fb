"""``/v1/score`` and ``/v1/index/stats``: the read side over HTTP."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Response

from router.api.deps import ApiError, get_service, require_read_key
from router.service import RouterService
from schemas.rest import ErrorResponse, ScoreRequest, ScoreResponse

router = APIRouter(prefix="/v1", tags=["scoring"])


def check_request_size(service: RouterService, token_ids: list[int]) -> None:
    """413 for prompts longer than ``max_request_tokens`` (shared with /v1/route)."""
    limit = service.settings.max_request_tokens
    if len(token_ids) > limit:
        raise ApiError(
            413,
            "payload_too_large",
            f"token_ids has {len(token_ids)} tokens; the limit is {limit}",
        )


@router.post(
    "/score",
    response_model=ScoreResponse,
    summary="per-worker prompt tokens each worker would reuse from its KV cache",
    responses={
        401: {"model": ErrorResponse, "description": "API key missing (with api_key_all)"},
        404: {"model": ErrorResponse, "description": "a worker named in `workers` is unknown"},
        413: {"model": ErrorResponse, "description": "token_ids longer than the limit"},
        422: {"model": ErrorResponse, "description": "invalid body"},
        503: {"model": ErrorResponse, "description": "index backend unavailable"},
    },
    dependencies=[Depends(require_read_key)],
)
async def score(body: ScoreRequest, service: RouterService = Depends(get_service)) -> Response:
    check_request_size(service, body.token_ids)
    result = await service.score(
        body.token_ids, body.workers, lora_name=body.lora_name, cache_salt=body.cache_salt
    )
    # Already a validated model: serialise once in pydantic-core, skip FastAPI's re-check.
    return Response(result.model_dump_json(), media_type="application/json")


@router.get(
    "/index/stats",
    summary="index size: workers, entries, map entries, bytes",
    responses={503: {"model": ErrorResponse, "description": "index backend unavailable"}},
)
async def index_stats(service: RouterService = Depends(get_service)) -> dict[str, Any]:
    return await service.index_stats()
