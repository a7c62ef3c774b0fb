"""``kvroute serve``: run the router (REST API + event ingestion) under uvicorn.

Every flag has a ``KVROUTE_*`` environment variable and a config-file key of the same
name; precedence is flag > environment > ``--config`` file > default.
"""

from __future__ import annotations

import argparse
import gc
import ipaddress
import json
import logging
import sys

from pydantic import ValidationError

from router.config import ENV_PREFIX, RouterSettings, load_settings, parse_worker_spec
from router.logging_setup import configure_logging
from router.routing.profiles import PROFILE_NAMES

log = logging.getLogger("router.serve")


def build_parser() -> argparse.ArgumentParser:
    env = ENV_PREFIX
    p = argparse.ArgumentParser(
        prog="kvroute serve",
        description="Run the cache-aware router: subscribe to engines' KV events, "
        "answer /v1/score and friends. Every flag also reads KVROUTE_<NAME>.",
    )
    add = p.add_argument
    add("--config", metavar="FILE", help=f"YAML/JSON settings file ({env}CONFIG)")
    add("--host", help=f"bind address ({env}HOST, default 127.0.0.1)")
    add("--port", type=int, help=f"HTTP port ({env}PORT, default 8000)")
    add("--index", choices=("memory", "redis"), help=f"index backend ({env}INDEX)")
    add("--redis-url", help=f"Redis URL for --index redis ({env}REDIS_URL)")
    add(
        "--worker",
        dest="workers",
        action="append",
        metavar="ID=ENDPOINT[,replay=EP][,topic=T][,http=URL][,model=M]",
        help=f"register a worker at start-up; repeatable ({env}WORKERS: specs separated "
        "by ';' or a JSON list)",
    )
    add(
        "--listen",
        metavar="ENDPOINT",
        help=f"bind one SUB that engines connect to, e.g. tcp://*:5557; workers are "
        f"created from topics kv@<worker>[@<model>] ({env}LISTEN)",
    )
    add(
        "--api-key",
        help=f"key required on endpoints that mutate or add load: workers, route, finish, "
        f"completions ({env}API_KEY)",
    )
    add(
        "--engine-api-key",
        help=f"key the proxy sends to the engines as 'Authorization: Bearer' (their "
        f"--api-key) ({env}ENGINE_API_KEY)",
    )
    add(
        "--api-key-all",
        action=argparse.BooleanOptionalAction,
        default=None,
        help=f"also require the key on every read-only /v1 endpoint ({env}API_KEY_ALL)",
    )
    add(
        "--allow-insecure-remote",
        action=argparse.BooleanOptionalAction,
        default=None,
        help=f"allow a non-loopback --host without --api-key ({env}ALLOW_INSECURE_REMOTE)",
    )
    add(
        "--worker-allow",
        metavar="HOSTS",
        help=f"hosts, *.suffix patterns, CIDRs (and 'ipc') worker endpoints may name, "
        f"comma-separated; default any ({env}WORKER_ALLOW)",
    )
    add("--max-workers", type=int, help=f"most workers registered at once ({env}MAX_WORKERS)")
    add(
        "--log-json",
        action=argparse.BooleanOptionalAction,
        default=None,
        help=f"JSON log lines ({env}LOG_JSON)",
    )
    add("--log-level", choices=("debug", "info", "warning", "error"), help=f"({env}LOG_LEVEL)")
    add(
        "--access-log",
        action=argparse.BooleanOptionalAction,
        default=None,
        help=f"log every HTTP request ({env}ACCESS_LOG)",
    )
    add(
        "--route-profile",
        choices=PROFILE_NAMES,
        help=f"kv_aware weights measured for a kind of fleet; KVROUTE_ROUTE_WEIGHTS apply on "
        f"top ({env}ROUTE_PROFILE, default default; docs/routing.md, Route profiles)",
    )
    add("--max-request-tokens", type=int, help=f"413 above this ({env}MAX_REQUEST_TOKENS)")
    add("--replay-timeout-s", type=float, help=f"replay reply timeout ({env}REPLAY_TIMEOUT_S)")
    add(
        "--replay-max-frames",
        type=int,
        help=f"most frames one replay answer may hold ({env}REPLAY_MAX_FRAMES)",
    )
    add(
        "--replay-max-bytes",
        type=int,
        help=f"most payload bytes one replay answer may hold ({env}REPLAY_MAX_BYTES)",
    )
    add(
        "--stream-max-clients",
        type=int,
        help=f"most concurrent /v1/stream clients ({env}STREAM_MAX_CLIENTS)",
    )
    add(
        "--client-rate-limit",
        type=float,
        help=f"requests/s per client address, 0 = off ({env}CLIENT_RATE_LIMIT, 2000)",
    )
    add(
        "--client-rate-burst",
        type=int,
        help=f"requests a client may send at once above its rate ({env}CLIENT_RATE_BURST, 4000)",
    )
    add(
        "--stream-queue-size",
        type=int,
        help=f"summaries queued per stream client before it is dropped ({env}STREAM_QUEUE_SIZE)",
    )
    add(
        "--replay-on-connect",
        action=argparse.BooleanOptionalAction,
        default=None,
        help=f"replay a publisher's buffer on every (re)connect ({env}REPLAY_ON_CONNECT)",
    )
    add("--default-kind", help=f"group kind for engines that send none ({env}DEFAULT_KIND)")
    add(
        "--default-block-size",
        type=int,
        help=f"block size for events that lack one ({env}DEFAULT_BLOCK_SIZE)",
    )
    add(
        "--tier-weights",
        type=json.loads,
        metavar="JSON",
        help=f'e.g. \'{{"CPU": 0.8, "STORAGE": 0.5}}\' ({env}TIER_WEIGHTS)',
    )
    add(
        "--tokenizer",
        dest="tokenizers",
        action="append",
        metavar="[MODEL=]PATH",
        help="the proxy's tokenizer for MODEL (a dir with tokenizer.json, or an HF id in the "
        f"local cache); without MODEL= it serves any model; repeatable ({env}TOKENIZERS: JSON)",
    )
    add("--proxy-retries", type=int, help=f"retries on the next-best worker ({env}PROXY_RETRIES)")
    add("--proxy-timeout-s", type=float, help=f"upstream read timeout ({env}PROXY_TIMEOUT_S)")
    add(
        "--health-interval-s",
        type=float,
        help=f"seconds between worker health checks ({env}HEALTH_INTERVAL_S)",
    )
    return p


def parse_tokenizers(specs: list[str]) -> dict[str, str]:
    """``MODEL=PATH`` or ``PATH`` (any model) -> {model: path}."""
    out = {}
    for spec in specs:
        model, sep, path = spec.partition("=")
        if not sep:
            model, path = "*", spec
        if not model or not path:
            raise ValueError(f"--tokenizer {spec!r}: expected [MODEL=]PATH")
        out[model] = path
    return out


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def exposure_problem(settings: RouterSettings) -> str | None:
    """Why serving on ``settings.host`` is refused (None when it is not): beyond loopback
    without an API key anyone who can reach the port can register workers (and so make
    the router connect anywhere), route and finish requests."""
    if is_loopback(settings.host) or settings.api_key or settings.allow_insecure_remote:
        return None
    return (
        f"--host {settings.host} is reachable beyond this machine and no --api-key is set; "
        "set an API key, or pass --allow-insecure-remote to serve without one"
    )


def one_line_reason(exc: BaseException) -> str:
    """``exc`` as one line (the promise: status 2 and a one-line reason): each of
    pydantic's errors as ``field: message``, joined by "; "; any other message with its
    line breaks folded."""
    if isinstance(exc, ValidationError):
        parts = []
        for err in exc.errors(include_url=False):
            loc = ".".join(str(p) for p in err.get("loc", ()))
            msg = " ".join(str(err.get("msg", "invalid")).split())
            parts.append(f"{loc}: {msg}" if loc else msg)
        if parts:
            reason = "; ".join(parts)
            return reason if exc.title == RouterSettings.__name__ else f"{exc.title}: {reason}"
    return " ".join(str(exc).split()) or type(exc).__name__


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    overrides = {k: v for k, v in vars(args).items() if k != "config"}
    try:
        if overrides.get("workers"):
            overrides["workers"] = [parse_worker_spec(w) for w in overrides["workers"]]
        if overrides.get("tokenizers"):
            overrides["tokenizers"] = parse_tokenizers(overrides["tokenizers"])
        settings = load_settings(args.config, **overrides)
    except (ValidationError, ValueError, OSError) as exc:
        print(f"kvroute serve: invalid settings: {one_line_reason(exc)}", file=sys.stderr)
        return 2
    problem = exposure_problem(settings)
    if problem is not None:
        print(f"kvroute serve: {problem}", file=sys.stderr)
        return 2
    configure_logging(json=settings.log_json, level=settings.log_level)
    if not is_loopback(settings.host) and not settings.api_key:
        log.warning(
            "serving on %s WITHOUT an API key (--allow-insecure-remote): anyone who can reach "
            "this port can register and delete workers and route requests",
            settings.host,
            extra={"event": "insecure_remote"},
        )

    import uvicorn

    from router.http import create_app
    from router.service import (
        EndpointNotAllowed,
        InvalidEndpoint,
        RegistrationUnavailable,
        TooManyWorkers,
        WorkerExists,
    )

    try:
        app = create_app(settings=settings)
    except (
        InvalidEndpoint,
        WorkerExists,
        ValueError,
        TooManyWorkers,
        EndpointNotAllowed,
        RegistrationUnavailable,
    ) as exc:
        kind = "duplicate worker id" if isinstance(exc, WorkerExists) else "invalid settings"
        print(f"kvroute serve: {kind}: {one_line_reason(exc)}", file=sys.stderr)
        return 2
    log.info(
        "kvroute serve on http://%s:%d (index=%s, workers=%d, route policy=%s profile=%s%s)",
        settings.host,
        settings.port,
        settings.index,
        len(settings.workers),
        settings.route_policy,
        settings.route_profile,
        f" weights={settings.route_weights}" if settings.route_weights else "",
    )
    from router.http.protocol import protocol_class
    from router.proxy import outermost

    server = uvicorn.Server(
        uvicorn.Config(
            outermost(app),  # the proxy's hot path skips FastAPI's middleware stack
            http=protocol_class(),  # response head + body in one write (router/http/protocol.py)
            host=settings.host,
            port=settings.port,
            log_config=None,
            log_level=settings.log_level,
            access_log=settings.access_log,
            lifespan="on",
        )
    )
    # Open SSE streams never end by themselves: close them when a signal arrives.
    from router.http.stream import close_streams_on_exit

    close_streams_on_exit(server, app)
    # Start-up objects (modules, the app, tokenizers) out of the cyclic collector's scans:
    # without this a full collection of ~45 ms came within the first few thousand proxied
    # requests (benchmarks/proxy_cpu.py --gc; docs/proxy.md, "Overhead").
    gc.collect()
    gc.freeze()
    try:
        server.run()
    except KeyboardInterrupt:  # uvicorn re-raises Ctrl-C after its graceful shutdown
        return 130  # the shell's code for SIGINT, without a traceback
    return 0


if __name__ == "__main__":
    sys.exit(main())
