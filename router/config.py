"""Typed router configuration: defaults < config file < ``KVROUTE_*`` env < CLI flags.

One ``RouterSettings`` object carries every option so ``kvroute serve``, tests and the
demo build a router the same way. A YAML/JSON file (``--config FILE`` or
``KVROUTE_CONFIG``) uses the same field names as the environment, without the prefix.
"""

from __future__ import annotations

import difflib
import json
import os
from contextvars import ContextVar
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import Field, field_validator
from pydantic_settings import (
    BaseSettings,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from router.index.base import DEFAULT_TIER_WEIGHTS, EngineSettings
from schemas.endpoints import parse_allow_list
from schemas.rest import WorkerCreate

ENV_PREFIX = "KVROUTE_"


class WorkerSpec(WorkerCreate):
    """A registered worker: the REST body's fields (one definition, ``WorkerCreate``),
    plus what only the router sets. Start-up workers come from ``--worker`` /
    ``KVROUTE_WORKERS`` / the config file, the others from ``POST /v1/workers`` or the
    shared listener."""

    # Created from a topic by the shared listener (``--listen``): fed by its socket.
    via_listener: bool = False

    def engine_settings(self) -> EngineSettings:
        return EngineSettings(
            self.hash_block_size, self.eagle, self.partial_hash_hits, self.report_full
        )


_SPEC_KEYS = {
    "replay": "replay_endpoint",
    "replay_endpoint": "replay_endpoint",
    "topic": "topic",
    "model": "model",
    "http": "http_endpoint",
    "http_endpoint": "http_endpoint",
    "hash_block_size": "hash_block_size",
    "bind": "bind",
    "eagle": "eagle",
    "partial_hash_hits": "partial_hash_hits",
    "report_full": "report_full",
}


def parse_worker_spec(text: str) -> WorkerSpec:
    """``ID=ENDPOINT[,replay=EP][,topic=T][,http=URL][,model=M][,bind=true]
    [,hash_block_size=N][,eagle=true][,partial_hash_hits=true]`` -> ``WorkerSpec``."""
    head, *opts = text.strip().split(",")
    worker_id, sep, endpoint = head.partition("=")
    if not sep or not worker_id or not endpoint:
        raise ValueError(f"worker spec {text!r}: expected ID=ENDPOINT[,replay=EP][,topic=T]")
    data: dict[str, Any] = {"worker_id": worker_id.strip(), "endpoint": endpoint.strip()}
    for opt in opts:
        key, sep, value = opt.partition("=")
        field = _SPEC_KEYS.get(key.strip())
        if not sep or field is None:
            raise ValueError(f"worker spec {text!r}: unknown option {opt!r}")
        data[field] = value.strip()
    return WorkerSpec.model_validate(data)


# The parsed config file of the settings being built (a ContextVar so concurrent builds
# in one process - tests - never see each other's file).
_FILE_DATA: ContextVar[dict[str, Any] | None] = ContextVar("kvroute_config_file", default=None)


class _FileSource(PydanticBaseSettingsSource):
    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        data = _FILE_DATA.get() or {}
        return data.get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        data = _FILE_DATA.get() or {}
        return {k: v for k, v in data.items() if k in self.settings_cls.model_fields}


class RouterSettings(BaseSettings):
    """Every router option; the environment variable is ``KVROUTE_`` + the upper-case name."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore")

    # HTTP server
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    log_json: bool = False
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    access_log: bool = False
    # Auth (docs/security.md): the key is required on every mutating or load-changing
    # endpoint (workers register/delete, route, finish), and on every /v1 read too with
    # api_key_all. Binding beyond loopback without a key needs allow_insecure_remote.
    api_key: str | None = None
    api_key_all: bool = False
    allow_insecure_remote: bool = False
    # The key the proxy presents to the engines (``Authorization: Bearer``; vLLM's
    # ``--api-key``) on forwarded requests, warming, health checks and pass-throughs.
    # Without it, the client's ``Authorization`` is forwarded unless api_key is set (then
    # it is the router's key, which stays here).
    engine_api_key: str | None = None
    # Worker registration: hosts/CIDRs the router may connect to (empty = any), and a cap
    # on workers (each holds ZMQ sockets; the context's socket limit is sized from it).
    worker_allow: Annotated[list[str], NoDecode] = Field(default_factory=list)
    max_workers: int = Field(default=128, ge=1, le=4096)
    # Index
    index: Literal["memory", "redis"] = "memory"
    redis_url: str = "redis://127.0.0.1:6379/0"
    # Ingest
    default_kind: str = "full_attention"
    default_block_size: int | None = Field(default=None, ge=1)
    workers: Annotated[list[WorkerSpec], NoDecode] = Field(default_factory=list)
    replay_timeout_s: float = Field(default=2.0, gt=0)
    # Bounds on one replay answer (frames and payload bytes); beyond them it is dropped.
    replay_max_frames: int = Field(default=100_000, ge=1)
    replay_max_bytes: int = Field(default=256 << 20, ge=1024)
    # Replay each publisher's buffer whenever its SUB connection is (re)established.
    replay_on_connect: bool = True
    # One bound SUB every engine connects to (llm-d's deployment); workers are created
    # from topics ``kv@<worker>[@<model>]`` (router.ingest.listener).
    listen: str | None = None
    # A worker that has sent no batch this long after registration is flagged ``silent``
    # (status, metric, one warning): a wrong endpoint, topic or bind/connect mismatch.
    silent_after_s: float = Field(default=30.0, gt=0)
    # After this long without frames, ask the replay socket for frames lost at the tail
    # of the stream (PUB/SUB has no heartbeat); 0 disables.
    tail_check_s: float = Field(default=5.0, ge=0)
    # How often a shared index (Redis) is checked for lost content (restarted empty,
    # flushed); 0 disables.
    index_check_s: float = Field(default=2.0, ge=0)
    # A shared index that defers a worker's batches (another router cleared the worker
    # and rebuilds it in order) but stands still this long: that router stopped midway;
    # this one clears and rebuilds the worker itself. 0 disables.
    index_defer_max_s: float = Field(default=30.0, ge=0)
    sub_hwm: int = Field(default=100_000, ge=0)
    # Largest message a SUB socket takes (ZMQ_MAXMSGSIZE): a bigger one is refused by ZMQ
    # before it is buffered and the connection dropped (re-established: the peer
    # reconnects to a bound SUB, the router reconnects a connecting one), so no publisher,
    # nor anything that reaches a ``listen`` or ``bind`` endpoint, can make the router hold
    # an unbounded message. The lost batch is a gap (``kvroute_gaps_total``), replayed
    # where the worker has a replay endpoint. vLLM's batches are a step's events:
    # kilobytes, a few MB for a very long prompt.
    sub_max_message_bytes: int = Field(default=64 << 20, ge=1024)
    ingest_retry_initial_s: float = Field(default=0.05, gt=0)
    ingest_retry_max_s: float = Field(default=2.0, gt=0)
    # Scoring / API limits
    tier_weights: dict[str, float] = Field(default_factory=lambda: dict(DEFAULT_TIER_WEIGHTS))
    max_request_tokens: int = Field(default=262_144, ge=1)
    recent_routes: int = Field(default=200, ge=1)
    # Dashboard stream (/v1/stream): seconds between summaries
    stream_period_s: float = Field(default=1.0, gt=0)
    stream_max_clients: int = Field(default=256, ge=1)
    # Requests per second per client address (token bucket; 0 = off) and its burst.
    client_rate_limit: float = Field(default=2000.0, ge=0)
    client_rate_burst: int = Field(default=4000, ge=1)
    stream_queue_size: int = Field(default=8, ge=1)
    # Routing (/v1/route; see router.routing.policy and docs/routing.md#api)
    route_policy: str = "kv_aware"
    # A named weight set for the fleet the engines make (router.routing.profiles;
    # docs/routing.md#route-profiles-which-weights-for-which-fleet); route_weights on top.
    route_profile: str = "default"
    route_weights: dict[str, float] = Field(
        default_factory=dict, description="kv_aware weight overrides, e.g. {decode: 128}"
    )
    route_inflight_ttl_s: float = Field(default=120.0, gt=0)
    route_prefill_tps: float = Field(default=16_000.0, ge=0)
    route_predict_ttl_s: float = Field(default=3.0, ge=0)
    route_prefix_block_tokens: int = Field(default=64, ge=1)
    route_seed: int | None = None
    # OpenAI-compatible proxy (router/proxy; docs/proxy.md)
    tokenizers: dict[str, str] = Field(
        default_factory=dict,
        description="model -> tokenizer dir / file / HF id in the local cache; '*' = any model",
    )
    proxy_retries: int = Field(default=2, ge=0, le=16)
    proxy_connect_timeout_s: float = Field(default=2.0, gt=0)
    proxy_timeout_s: float = Field(default=600.0, gt=0)
    proxy_max_connections: int = Field(default=1024, ge=1)
    proxy_require_events: bool = True
    health_interval_s: float = Field(default=2.0, gt=0)
    health_timeout_s: float = Field(default=1.0, gt=0)
    health_failures: int = Field(default=2, ge=1)

    @field_validator("workers", mode="before")
    @classmethod
    def _parse_workers(cls, value: Any) -> Any:
        """Accept a JSON list or ``ID=EP[,...]`` specs separated by ``;`` or whitespace."""
        if isinstance(value, str):
            text = value.strip()
            if not text:
                return []
            if text.startswith("["):
                return json.loads(text)
            return [parse_worker_spec(s) for s in text.replace(";", " ").split()]
        if isinstance(value, list):
            return [parse_worker_spec(v) if isinstance(v, str) else v for v in value]
        return value

    @field_validator("worker_allow", mode="before")
    @classmethod
    def _parse_allow(cls, value: Any) -> Any:
        """A list, or hosts/CIDRs separated by commas or whitespace; each one checked."""
        if isinstance(value, str):
            value = value.replace(",", " ").split()
        if isinstance(value, list):
            parse_allow_list([str(v) for v in value])  # raises ValueError naming the entry
        return value

    @field_validator("tier_weights")
    @classmethod
    def _check_weights(cls, value: dict[str, float]) -> dict[str, float]:
        return {**DEFAULT_TIER_WEIGHTS, **{k.upper(): float(v) for k, v in value.items()}}

    @field_validator("route_policy")
    @classmethod
    def _check_route_policy(cls, value: str) -> str:
        from router.routing.policy import check_policy

        return check_policy(value)

    @field_validator("route_profile")
    @classmethod
    def _check_route_profile(cls, value: str) -> str:
        from router.routing.profiles import check_profile

        return check_profile(value)

    @field_validator("route_weights")
    @classmethod
    def _check_route_weights(cls, value: dict[str, float]) -> dict[str, float]:
        from router.routing.policy import policy_weights

        policy_weights(value)  # raises ValueError naming the bad weight
        return value

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, env_settings, _FileSource(settings_cls))


def read_config_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Parse a YAML or JSON config file into a dict (JSON is valid YAML, but be explicit)."""
    text = Path(path).read_text(encoding="utf-8")
    data = json.loads(text) if str(path).endswith(".json") else yaml.safe_load(text)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ValueError(f"config file {path}: expected a mapping at the top level")
    return data


def _unknown(names: set[str], known: set[str], what: str) -> str:
    hints = []
    for name in sorted(names):
        close = difflib.get_close_matches(name, sorted(known), n=1)
        hints.append(f"{name} (did you mean {close[0]}?)" if close else name)
    return f"unknown {what}: {', '.join(hints)}"


# ``KVROUTE_*`` variables read before the settings (the compiled core's switches in
# ``router.native`` and setup.py, the ingest fast path's): not settings, and not typos.
PROCESS_ENV = frozenset(
    {"KVROUTE_NATIVE", "KVROUTE_NATIVE_BUILD", "KVROUTE_NATIVE_XXHASH", "KVROUTE_INGEST_FAST_PATH"}
)


def check_unknown_keys(
    file_data: dict[str, Any] | None, environ: dict[str, str] | None = None
) -> None:
    """``ValueError`` naming every config-file key and ``KVROUTE_*`` variable that is not
    a setting: a typo must not leave the router silently on a default (0 workers...)."""
    fields = set(RouterSettings.model_fields)
    problems = []
    if file_data:
        bad = {str(k) for k in file_data} - fields
        if bad:
            problems.append(_unknown(bad, fields, "config file key(s)"))
    env = os.environ if environ is None else environ
    known_env = {ENV_PREFIX + f.upper() for f in fields} | {ENV_PREFIX + "CONFIG"} | PROCESS_ENV
    bad_env = {k for k in env if k.upper().startswith(ENV_PREFIX) and k.upper() not in known_env}
    if bad_env:
        problems.append(_unknown(bad_env, known_env, "environment variable(s)"))
    if problems:
        raise ValueError("; ".join(problems))


def load_settings(config_file: str | None = None, **overrides: Any) -> RouterSettings:
    """Build settings from defaults, the config file (or ``KVROUTE_CONFIG``), env, overrides.

    ``overrides`` (CLI flags) win; keys whose value is None are ignored. Unknown file keys
    and ``KVROUTE_*`` variables raise ``ValueError``.
    """
    path = config_file or os.environ.get(f"{ENV_PREFIX}CONFIG")
    data = read_config_file(path) if path else None
    check_unknown_keys(data)
    token = _FILE_DATA.set(data)
    try:
        return RouterSettings(**{k: v for k, v in overrides.items() if v is not None})
    finally:
        _FILE_DATA.reset(token)
