"""Shared pieces of the HTTP layer: the service dependency, API errors and the API key.

The auth rule (docs/security.md), applied by one of the two dependencies below on every
``/v1`` endpoint: with ``api_key`` set, every endpoint that mutates state or adds load
(register/delete workers, ``/v1/route``, ``/v1/requests/{id}/finish``) needs the key;
read-only ``/v1`` endpoints (score, workers list, index stats, stream) need it only with
``api_key_all``. Probes, metrics and the dashboard page (``/healthz``, ``/readyz``,
``/metrics``, ``/``) are always open.
"""

from __future__ import annotations

import hmac

from fastapi import Request

from router.service import RouterService


class ApiError(Exception):
    """An error answered as ``{"error": {"code", "message"}}`` with ``status``."""

    def __init__(
        self, status: int, code: str, message: str, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.headers = headers


def service_of(request: Request) -> RouterService:
    """The ``RouterService`` behind this app (``app.state.service``)."""
    return request.app.state.service


# The dependencies below are ``async def`` on purpose: FastAPI runs a plain ``def``
# dependency in a worker thread, and that hop per request cost more than the HTTP layer's
# own work on /v1/score (measured).
async def get_service(request: Request) -> RouterService:
    """Dependency: the ``RouterService`` behind this app."""
    return service_of(request)


def _presented_key(request: Request) -> str | None:
    auth = request.headers.get("authorization")
    if auth is not None:
        scheme, _, token = auth.partition(" ")
        if scheme.lower() == "bearer" and token:
            return token.strip()
    return request.headers.get("x-api-key")


def check_api_key(request: Request, *, mutating: bool) -> None:
    """Raise 401 unless the request carries the configured key (when one is required)."""
    settings = service_of(request).settings
    expected = settings.api_key
    if not expected or not (mutating or settings.api_key_all):
        return
    got = _presented_key(request)
    if got is None or not hmac.compare_digest(got.encode(), expected.encode()):
        raise ApiError(
            401,
            "unauthorized",
            "this endpoint needs the API key: send 'Authorization: Bearer KEY' or 'X-API-Key: KEY'",
            headers={"WWW-Authenticate": "Bearer"},
        )


async def require_write_key(request: Request) -> None:
    """Dependency for endpoints that mutate state or add load (workers register/delete,
    route, finish): the key is needed whenever one is set."""
    check_api_key(request, mutating=True)


async def require_read_key(request: Request) -> None:
    """Dependency for read-only /v1 endpoints (score, workers, stats, stream): open
    unless ``api_key_all``."""
    check_api_key(request, mutating=False)
