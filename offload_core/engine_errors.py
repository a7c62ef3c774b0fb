"""The simulated engine's errors as vLLM 0.33's server answers them.

Split from ``engine_app`` (the endpoints): one body shape, ``{"error": {"message", "type",
"param", "code": status}}``, for a refused request, a body the request model rejects and
any HTTP error, so an OpenAI client reads the simulated engine as it reads vLLM.
"""

from __future__ import annotations

import re
from http import HTTPStatus

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException


def error_response(
    status: int, message: str, kind: str | None = None, param: str | None = None
) -> JSONResponse:
    """vLLM's error body: ``code`` the status, ``type`` an exception-style name for a
    refused request (``BadRequestError``, ``NotFoundError``) or the HTTP phrase otherwise."""
    kind = kind or HTTPStatus(status).phrase
    body = {"message": message, "type": kind, "param": param, "code": status}
    return JSONResponse({"error": body}, status_code=status)


# pydantic's own wrapper segments of an error location ("list[int]", "function-after[..]")
# are not fields a client knows: vLLM leaves them out of ``param``.
_INTERNAL = re.compile(r"[\[\]{}()]")
_WRAPPERS = frozenset({"union", "tagged-union", "chain", "default", "nullable", "lax-or-strict"})


class Reject(Exception):
    """A request refused as vLLM refuses it (400 ``BadRequestError`` unless told)."""

    def __init__(
        self,
        message: str,
        status: int = 400,
        kind: str = "BadRequestError",
        param: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.kind, self.message, self.param = status, kind, message, param


def install_error_handlers(app: FastAPI) -> None:
    """Every error ``app`` answers leaves in vLLM's body."""

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        # As vLLM: 400 "Bad Request", ``param`` the first error's field.
        errors = exc.errors()
        first = errors[0] if errors else {}
        loc = [str(p) for p in first.get("loc", ())]
        loc = [p for p in loc if not _INTERNAL.search(p) and p not in _WRAPPERS] or loc
        label = "error" if len(errors) == 1 else "errors"
        lines = "".join(f"\n  {e.get('loc')}: {e.get('msg')}" for e in errors[:10])
        message = f"{len(errors)} validation {label}:{lines}"
        return error_response(400, message, param=".".join(loc) or None)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return error_response(exc.status_code, str(exc.detail))

    @app.exception_handler(Reject)
    async def _reject(_: Request, exc: Reject) -> JSONResponse:
        return error_response(exc.status, exc.message, exc.kind, exc.param)
