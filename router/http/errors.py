"""The error answers the endpoints document, named once.

Every 4xx/5xx body is ``{"error": {"code", "message"}}`` (``schemas.rest.ErrorResponse``);
the endpoints list which ones they give in OpenAPI's ``responses=``. The entries shared by
several endpoints (the two API-key rules, body limits, an index that is down) are defined
here so their wording cannot drift apart; an endpoint adds its own with ``error(code, why)``.
"""

from __future__ import annotations

from typing import Any

from schemas.rest import ErrorResponse

Entry = tuple[int, str]

WRITE_KEY: Entry = (401, "API key missing or wrong (when one is set)")
READ_KEY: Entry = (401, "API key missing or wrong (with api_key_all)")
UNKNOWN_WORKER_NAMED: Entry = (404, "a worker named in `workers` is unknown")
UNKNOWN_WORKER: Entry = (404, "unknown worker")
TOO_MANY_TOKENS: Entry = (413, "token_ids longer than the limit")
INVALID_BODY: Entry = (422, "invalid body")
INDEX_DOWN: Entry = (503, "index backend unavailable")


def error(code: int, description: str) -> Entry:
    """An endpoint's own entry."""
    return (code, description)


def responses(*entries: Entry) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses=`` for these entries (a later entry of the same code wins)."""
    return {code: {"model": ErrorResponse, "description": why} for code, why in entries}
