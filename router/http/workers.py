"""``/v1/workers``: register, list, inspect and delete workers."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request, Response
from pydantic import BaseModel, Field, ValidationError

from router.config import WorkerSpec
from router.http.deps import ApiError, get_service, require_read_key, require_write_key
from router.http.errors import READ_KEY, UNKNOWN_WORKER, WRITE_KEY, error, responses
from router.service import (
    EndpointNotAllowed,
    InvalidEndpoint,
    RegistrationUnavailable,
    RouterService,
    TooManyWorkers,
    WorkerExists,
    WorkerStatus,
)
from schemas.rest import WorkerCreate

router = APIRouter(prefix="/v1/workers", tags=["workers"])


class WorkerView(WorkerStatus):
    """``WorkerStatus`` plus what the OpenAI proxy knows about the worker."""

    proxy: dict[str, Any] | None = Field(
        default=None,
        description="live (and why not), routed requests, estimated hit tokens vs "
        "engine-reported cached tokens, share of exact estimates (docs/proxy.md)",
    )


class WorkerStatusList(BaseModel):
    workers: list[WorkerView]


def _view(request: Request, status: WorkerStatus) -> WorkerView:
    proxy = getattr(request.app.state, "proxy", None)
    fields = proxy.worker_view(status.worker_id) if proxy is not None else None
    return WorkerView(**status.model_dump(), proxy=fields)


@router.post(
    "",
    status_code=201,
    response_model=WorkerStatus,
    summary="register a worker and subscribe to its KV event stream",
    responses=responses(
        WRITE_KEY,
        error(403, "endpoint outside worker_allow"),
        error(409, "worker id exists, or max_workers reached"),
        error(422, "invalid body or endpoint"),
        error(503, "sockets exhausted; retry later"),
    ),
    dependencies=[Depends(require_write_key)],
)
async def create_worker(
    body: WorkerCreate, service: RouterService = Depends(get_service)
) -> WorkerStatus:
    try:
        spec = WorkerSpec.model_validate(body.model_dump())
        return await service.add_worker(spec)
    except ValidationError as exc:
        raise ApiError(422, "invalid_request", str(exc.errors()[0].get("msg"))) from None
    except WorkerExists:
        raise ApiError(
            409, "worker_exists", f"worker {body.worker_id!r} is already registered"
        ) from None
    except TooManyWorkers as exc:
        raise ApiError(409, "too_many_workers", str(exc)) from None
    except EndpointNotAllowed as exc:
        raise ApiError(403, "endpoint_not_allowed", str(exc)) from None
    except InvalidEndpoint as exc:
        raise ApiError(422, "invalid_endpoint", str(exc)) from None
    except RegistrationUnavailable as exc:
        raise ApiError(503, "sockets_exhausted", str(exc), {"Retry-After": "5"}) from None


@router.get(
    "",
    response_model=WorkerStatusList,
    summary="every registered worker",
    responses=responses(READ_KEY),
    dependencies=[Depends(require_read_key)],
)
async def list_workers(
    request: Request, service: RouterService = Depends(get_service)
) -> WorkerStatusList:
    return WorkerStatusList(workers=[_view(request, w) for w in await service.worker_infos()])


@router.get(
    "/{worker_id}",
    response_model=WorkerView,
    summary="one worker",
    responses=responses(READ_KEY, UNKNOWN_WORKER),
    dependencies=[Depends(require_read_key)],
)
async def get_worker(
    worker_id: str, request: Request, service: RouterService = Depends(get_service)
) -> WorkerView:
    return _view(request, await service.worker_info(worker_id))


@router.delete(
    "/{worker_id}",
    status_code=204,
    response_class=Response,
    summary="unsubscribe a worker and drop its index entries",
    responses=responses(WRITE_KEY, UNKNOWN_WORKER),
    dependencies=[Depends(require_write_key)],
)
async def delete_worker(worker_id: str, service: RouterService = Depends(get_service)) -> Response:
    await service.remove_worker(worker_id)
    return Response(status_code=204)
