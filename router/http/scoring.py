"""``/v1/score`` and ``/v1/index/stats``: the read side over HTTP."""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
from fastapi import APIRouter, Depends, Request, Response

from router.http.deps import ApiError, check_api_key, get_service, require_read_key, service_of
from router.http.errors import (
    INDEX_DOWN,
    INVALID_BODY,
    READ_KEY,
    TOO_MANY_TOKENS,
    UNKNOWN_WORKER_NAMED,
    responses,
)
from router.service import RouterService
from schemas.rest import (
    MAX_STR_LEN,
    MAX_WORKERS_PER_REQUEST,
    TOKEN_ID_MAX,
    ScoreRequest,
    ScoreResponse,
)

router = APIRouter(prefix="/v1", tags=["scoring"])

# The same bounds as ``schemas.rest.ScoreRequest``: a token id is a non-negative int64
# (an id beyond int64 used to reach the chain encoder and answer 500), at least one
# token, short strings.
TokenId = Annotated[int, msgspec.Meta(ge=0, le=TOKEN_ID_MAX)]
ShortStr = Annotated[str, msgspec.Meta(max_length=MAX_STR_LEN)]
WorkerId = Annotated[str, msgspec.Meta(min_length=1, max_length=128)]


class ScoreBody(msgspec.Struct, forbid_unknown_fields=True):
    """``ScoreRequest`` for msgspec: the same fields and strictness (no bools or floats as
    token ids, no unknown keys), decoded straight from bytes.

    Why not FastAPI's pydantic body: for an 8k-token prompt, ``json.loads`` plus model
    validation costs several times a typed msgspec decode, on the hottest endpoint. The
    OpenAPI schema still documents ``ScoreRequest``.
    """

    token_ids: Annotated[list[TokenId], msgspec.Meta(min_length=1)]
    skip_prefix_cache: bool = False
    lora_name: ShortStr | None = None
    cache_salt: ShortStr | None = None
    workers: Annotated[list[WorkerId], msgspec.Meta(max_length=MAX_WORKERS_PER_REQUEST)] | None = (
        None
    )


_score_decoder = msgspec.json.Decoder(ScoreBody)


async def read_score_body(request: Request, decoder: Any = _score_decoder) -> Any:
    """Decode a score-shaped JSON body; 422 with the offending path on any mistake.

    ``decoder`` lets /v1/route reuse this with a struct that has its extra fields.
    """
    try:
        return decoder.decode(await request.body())
    except msgspec.ValidationError as exc:
        raise ApiError(422, "invalid_request", f"invalid body: {exc}") from None
    except msgspec.DecodeError as exc:
        raise ApiError(422, "invalid_request", f"body is not valid JSON: {exc}") from None
    except UnicodeError:  # msgspec raises it for invalid UTF-8 inside a JSON string
        raise ApiError(422, "invalid_request", "body is not valid UTF-8 JSON") from None
    except RecursionError:
        raise ApiError(422, "invalid_request", "body is nested too deeply") from None


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
    responses=responses(READ_KEY, UNKNOWN_WORKER_NAMED, TOO_MANY_TOKENS, INVALID_BODY, INDEX_DOWN),
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": ScoreRequest.model_json_schema()}},
        }
    },
)
async def score(request: Request) -> Response:
    service = service_of(request)
    check_api_key(request, mutating=False)
    body: ScoreBody = await read_score_body(request)
    check_request_size(service, body.token_ids)
    return Response(
        _encoder.encode(
            await service.score_result(
                body.token_ids,
                body.workers,
                lora_name=body.lora_name,
                cache_salt=body.cache_salt,
                skip_prefix_cache=body.skip_prefix_cache,
            )
        ),
        media_type="application/json",
    )


_encoder = msgspec.json.Encoder()


@router.get(
    "/index/stats",
    summary="index size: workers, entries, map entries, bytes",
    responses=responses(READ_KEY, INDEX_DOWN),
    dependencies=[Depends(require_read_key)],
)
async def index_stats(service: RouterService = Depends(get_service)) -> dict[str, Any]:
    return await service.index_stats()
