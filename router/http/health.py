"""Liveness, readiness and Prometheus metrics."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Response

from router import native
from router.http.deps import ApiError, get_service
from router.http.errors import INDEX_DOWN, responses
from router.metrics import CONTENT_TYPE
from router.service import RouterService

router = APIRouter(tags=["health"])


@router.get("/healthz", summary="liveness: the process answers")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get(
    "/readyz",
    summary="readiness: the index backend answers",
    responses=responses(INDEX_DOWN),
)
async def readyz(service: RouterService = Depends(get_service)) -> dict[str, str]:
    if not await service.ready():
        raise ApiError(
            503,
            "index_unavailable",
            f"the {service.index.kind} index backend does not answer",
        )
    # "core": the scorer's compiled core or "python" (router/native, docs/development.md)
    return {"status": "ready", "index": service.index.kind, "core": native.ACTIVE}


@router.get(
    "/metrics",
    summary="Prometheus metrics (kvroute_*)",
    response_class=Response,
    responses={200: {"content": {CONTENT_TYPE: {}}}},
)
async def metrics(service: RouterService = Depends(get_service)) -> Response:
    return Response(await service.metrics.render(), media_type=CONTENT_TYPE)
