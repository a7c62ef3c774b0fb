"""REST request/response models of the router's v1 API (docs/design.md#rest-contract).

Pydantic models because FastAPI validates and documents them (OpenAPI) for free; the
hot wire path uses msgspec instead. Field names are the stable public contract.
"""

from __future__ import annotations

from http import HTTPStatus
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictInt

from schemas.endpoints import validate_http_endpoint, validate_zmq_endpoint

WORKER_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:@-]{0,127}$"
# Bounds on client-supplied values: a token id is a non-negative int64 (what every engine
# accepts and the chain encoders can pack); strings are short labels.
TOKEN_ID_MAX = (1 << 63) - 1
MAX_STR_LEN = 256
MAX_WORKERS_PER_REQUEST = 4096

TokenId = Annotated[StrictInt, Field(ge=0, le=TOKEN_ID_MAX)]
ShortStr = Annotated[str, Field(max_length=MAX_STR_LEN)]
WorkerId = Annotated[str, Field(min_length=1, max_length=128)]
Endpoint = Annotated[
    str,
    Field(min_length=1, max_length=512, description="ZMQ endpoint: tcp://HOST:PORT or ipc://PATH"),
    AfterValidator(validate_zmq_endpoint),
]
HttpEndpoint = Annotated[
    str,
    Field(min_length=1, max_length=512, description="http(s)://HOST[:PORT][/path]"),
    AfterValidator(validate_http_endpoint),
]


class ErrorBody(BaseModel):
    code: str
    message: str
    type: str = Field(description="the error's kind, named as vLLM's server names it")
    param: str | None = None


class ErrorResponse(BaseModel):
    """Every 4xx/5xx answer: ``{"error": {"code", "message", "type", "param"}}``."""

    error: ErrorBody


# vLLM's server names these statuses' errors after exception classes and any other
# status by its HTTP phrase ("Too Many Requests"): OpenAI-style clients read ``type``.
_ERROR_TYPES = {
    400: "BadRequestError",
    404: "NotFoundError",
    422: "UnprocessableEntityError",
    500: "InternalServerError",
    501: "NotImplementedError",
    503: "ServiceUnavailableError",
}


def error_body(status: int, code: str, message: str) -> dict[str, dict[str, str | None]]:
    """The body of every error the router answers (``ErrorResponse``): vLLM's shape, with
    ``code`` the router's own stable name for the error (vLLM puts the status there)."""
    try:
        kind = _ERROR_TYPES.get(status) or HTTPStatus(status).phrase
    except ValueError:
        kind = "Error"
    return {"error": {"code": code, "message": message, "type": kind, "param": None}}


class WorkerCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    worker_id: str = Field(pattern=WORKER_ID_PATTERN)
    endpoint: Endpoint = Field(description="ZMQ PUB endpoint, e.g. tcp://host:5557")
    replay_endpoint: Endpoint | None = Field(default=None, description="ZMQ replay ROUTER endpoint")
    topic: ShortStr = Field(default="", description="topic prefix filter; empty = every topic")
    model: ShortStr | None = None
    http_endpoint: HttpEndpoint | None = Field(
        default=None, description="engine HTTP base URL returned by /v1/route"
    )
    hash_block_size: int | None = Field(
        default=None, ge=1, description="vLLM's hash_block_size (default: learned)"
    )
    bind: bool = Field(
        default=False, description="bind the SUB at endpoint; the engine connects to it"
    )
    eagle: bool = Field(default=False, description="the engine runs EAGLE/MTP drafting")
    partial_hash_hits: bool = Field(
        default=False, description="hits align to the hash unit (mamba align mode)"
    )
    report_full: bool = Field(
        default=False,
        description='clients send kv_cache_report_mode "full": re-announced hit prefixes '
        "are recognised, not counted as copies",
    )


class GroupInfo(BaseModel):
    kind: str
    block_size: int
    sliding_window: int | None = None
    blocks_by_medium: dict[str, int] = Field(default_factory=dict)


class WorkerInfo(BaseModel):
    worker_id: str
    endpoint: str
    replay_endpoint: str | None = None
    topic: str = ""
    model: str | None = None
    http_endpoint: str | None = None
    state: Literal["connecting", "connected", "resyncing", "disconnected", "conflict"]
    hash_mode: Literal["unknown", "engine", "canonical"] = "unknown"
    last_seq: dict[str, int] = Field(default_factory=dict, description="per DP rank")
    events: int = 0
    gaps: int = 0
    replays: int = 0
    resyncs: int = 0
    silent: bool = Field(
        default=False, description="no batch yet, silent_after_s after registration"
    )
    partial_history: bool = Field(
        default=False,
        description="rebuilt from a replay buffer that did not reach seq 0: estimates "
        "are lower bounds until the engine clears its cache",
    )
    faulted: bool = Field(
        default=False,
        description="an index write failed; the worker is being rebuilt from its publisher",
    )
    groups: dict[int, GroupInfo] = Field(default_factory=dict)


class WorkerList(BaseModel):
    workers: list[WorkerInfo]


class ScoreRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    token_ids: list[TokenId] = Field(min_length=1)
    lora_name: ShortStr | None = None
    cache_salt: ShortStr | None = None
    workers: list[WorkerId] | None = Field(default=None, max_length=MAX_WORKERS_PER_REQUEST)
    skip_prefix_cache: bool = Field(
        default=False,
        description="the request skips reading the prefix cache (e.g. prompt logprobs): 0",
    )


class GroupScore(BaseModel):
    group_idx: int
    kind: str | None = None
    block_size: int | None = None
    learned: bool = True
    hit_tokens: int = 0
    hit_tokens_gpu: int = 0


class WorkerScore(BaseModel):
    worker_id: str
    hit_tokens: int
    hit_tokens_gpu: int
    score: float
    learned: bool = True
    groups: list[GroupScore] = Field(default_factory=list)
    lower_bound: bool = Field(
        default=False,
        description="the worker's history was rebuilt only in part (partial_history): "
        "blocks cached before it may be missing, so the true hit can only be higher",
    )


class ScoreResponse(BaseModel):
    request_tokens: int
    workers: list[WorkerScore]


class RouteRequest(ScoreRequest):
    request_id: str | None = Field(default=None, min_length=1, max_length=MAX_STR_LEN)
    policy: ShortStr | None = None


class RouteCandidate(BaseModel):
    worker_id: str
    hit_tokens: int
    hit_tokens_gpu: int
    score: float
    load: float = 0.0
    cost: float = 0.0


class RouteResponse(BaseModel):
    request_id: str
    worker_id: str
    endpoint: str | None
    hit_tokens: int
    candidates: list[RouteCandidate]
    # Prefix warming (the ``warm_chunk`` weight; empty when off or not needed): send the
    # worker these many first prompt tokens as requests of one output token each, one
    # after another, before the request itself.
    warm_prefixes: list[int] = Field(default_factory=list)
