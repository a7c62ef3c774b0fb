"""``/v1/route`` and ``/v1/requests/{id}/finish``: cache-aware routing over HTTP.

``install(app, service)`` is called by ``router.http.app.create_app``. The decision logic
is ``router.routing.state.RoutingCore`` (shared with ``kvroute bench routing``); this
module only scores the request, maps errors to JSON, records each decision in
``service.recent_routes`` for dashboards, and exports routing counters as metrics.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable, Iterator

from fastapi import APIRouter, Depends, FastAPI, Response
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from router.config import RouterSettings
from router.http.deps import ApiError, get_service, require_write_key
from router.http.errors import TOO_MANY_TOKENS, UNKNOWN_WORKER_NAMED, WRITE_KEY, error, responses
from router.http.scoring import check_request_size
from router.routing.policy import DEFAULT_POLICY, POLICY_NAMES, check_policy
from router.routing.profiles import profile_weights
from router.routing.state import Decision, DuplicateRequestError, RoutingConfig, RoutingCore
from router.service import RouterService
from schemas.rest import RouteCandidate, RouteRequest, RouteResponse

log = logging.getLogger(__name__)

router = APIRouter(tags=["routing"])

EXPIRE_INTERVAL_S = 1.0


def routing_config(settings: RouterSettings) -> RoutingConfig:
    """``RoutingConfig`` from the router settings' ``route_*`` fields (the profile's
    weights, ``route_weights`` on top); ``ValueError`` for an unknown policy, profile or
    weight name."""
    return RoutingConfig(
        weights=profile_weights(settings.route_profile, settings.route_weights),
        profile=settings.route_profile,
        default_policy=check_policy(settings.route_policy or DEFAULT_POLICY),
        inflight_ttl_s=settings.route_inflight_ttl_s,
        prefill_tps=settings.route_prefill_tps,
        predict_ttl_s=settings.route_predict_ttl_s,
        prefix_block_tokens=settings.route_prefix_block_tokens,
        seed=settings.route_seed,
    )


async def get_core(service: RouterService = Depends(get_service)) -> RoutingCore:
    return service.routing  # type: ignore[attr-defined]


def _candidates(decision: Decision) -> list[RouteCandidate]:
    rows = [
        RouteCandidate(
            worker_id=v.worker_id,
            hit_tokens=v.hit_tokens,
            hit_tokens_gpu=v.hit_tokens_gpu,
            score=v.score,
            load=round(load, 3),
            cost=round(cost, 3),
        )
        for v, load, cost in zip(decision.views, decision.loads, decision.costs, strict=True)
    ]
    # The chosen worker first, then the rest by cost (best alternative next).
    rows.sort(key=lambda c: (c.worker_id != decision.worker_id, c.cost, c.worker_id))
    return rows


def _duplicate(request_id: str) -> ApiError:
    return ApiError(409, "duplicate_request", f"request {request_id!r} is already in flight")


@router.post(
    "/v1/route",
    response_model=RouteResponse,
    summary="choose a worker for a request (cache affinity vs load) and count it in flight",
    responses=responses(
        WRITE_KEY,
        UNKNOWN_WORKER_NAMED,
        error(409, "request_id is already in flight"),
        TOO_MANY_TOKENS,
        error(422, "invalid body or unknown policy"),
        error(503, "no workers, or index unavailable"),
    ),
    # Routing adds in-flight load: it needs the key like finish, which releases it.
    dependencies=[Depends(require_write_key)],
)
async def route(
    body: RouteRequest,
    service: RouterService = Depends(get_service),
    core: RoutingCore = Depends(get_core),
) -> RouteResponse:
    check_request_size(service, body.token_ids)
    try:
        policy = check_policy(body.policy or core.config.default_policy)
    except ValueError as exc:
        raise ApiError(422, "unknown_policy", str(exc)) from None
    request_id = body.request_id or uuid.uuid4().hex
    if request_id in core.inflight:  # checked first too, to spare scoring a duplicate
        raise _duplicate(request_id)
    if body.workers == []:  # the caller's own choice of nothing: a bad request
        raise ApiError(422, "invalid_request", "workers: an empty list leaves nothing to route to")
    if body.workers is None and not service.worker_ids():
        raise ApiError(503, "no_workers", "no workers are registered to route to")
    scores = await service.score_result(
        body.token_ids,
        body.workers,
        lora_name=body.lora_name,
        cache_salt=body.cache_salt,
        skip_prefix_cache=body.skip_prefix_cache,
    )
    try:
        decision = core.route(request_id, body.token_ids, scores.workers, policy=policy)
    except DuplicateRequestError:  # raced with another route of the same id
        raise _duplicate(request_id) from None
    try:
        endpoint = service.worker_spec(decision.worker_id).http_endpoint
    except KeyError:  # removed while we scored: still answer, without an endpoint
        endpoint = None
    service.recent_routes.append(
        {
            "ts": time.time(),
            "request_id": request_id,
            "worker_id": decision.worker_id,
            "hit_tokens": decision.hit_tokens,
            "request_tokens": decision.request_tokens,
            "policy": decision.policy,
        }
    )
    return RouteResponse(
        request_id=request_id,
        worker_id=decision.worker_id,
        endpoint=endpoint,
        hit_tokens=decision.hit_tokens,
        candidates=_candidates(decision),
        warm_prefixes=list(decision.warm),
    )


@router.post(
    # ``:path``: a request id may hold "/" (vLLM's and clients' ids are free-form), and
    # every id /v1/route accepts must be finishable.
    "/v1/requests/{request_id:path}/finish",
    status_code=204,
    response_class=Response,
    summary="the request is done: stop counting it as load on its worker",
    responses=responses(WRITE_KEY, error(404, "unknown, finished or expired request")),
    dependencies=[Depends(require_write_key)],
)
async def finish(request_id: str, core: RoutingCore = Depends(get_core)) -> Response:
    if not core.finish(request_id):
        raise ApiError(
            404, "unknown_request", f"request {request_id!r} is not in flight (finished or expired)"
        )
    return Response(status_code=204)


class _RoutingCollector(Collector):
    """Reads the core's plain counters at scrape time."""

    def __init__(self, core: RoutingCore) -> None:
        self.core = core

    def collect(self) -> Iterator[Metric]:
        core = self.core
        yield InfoMetricFamily(
            "kvroute_route_config",
            "the routing set-up: default policy and route profile (route_weights on top)",
            value={"policy": core.config.default_policy, "profile": core.config.profile},
        )
        routes = CounterMetricFamily(
            "kvroute_routes",
            "requests routed (/v1/route and the proxy), per policy",
            labels=["policy"],
        )
        for name in POLICY_NAMES:
            routes.add_metric([name], core.routed.get(name, 0))
        yield routes
        yield CounterMetricFamily(
            "kvroute_route_finished", "in-flight requests finished", value=core.finished
        )
        yield CounterMetricFamily(
            "kvroute_route_expired",
            "in-flight requests dropped by their TTL (finish never called)",
            value=core.inflight.expired,
        )
        inflight = GaugeMetricFamily(
            "kvroute_route_inflight", "requests in flight per worker", labels=["worker"]
        )
        for worker, n in sorted(core.inflight_by_worker().items()):
            inflight.add_metric([worker], n)
        yield inflight
        yield GaugeMetricFamily(
            "kvroute_route_predicted_entries",
            "live predicted prefix entries (bursts placed before their events arrive)",
            value=core.memory.predicted_entries,
        )
        pressure = core.pressure
        checks = CounterMetricFamily(
            "kvroute_route_hit_checks",
            "cache hits the router could check, by how: a routed prompt continued "
            "(index), or the engine's reported cached tokens",
            labels=["via"],
        )
        lost = CounterMetricFamily(
            "kvroute_route_hits_lost",
            "of those, hits lost to eviction (before routing, or while queued at the engine)",
            labels=["via"],
        )
        checks.add_metric(["continuation"], pressure.continuations)
        checks.add_metric(["engine_report"], pressure.reports)
        lost.add_metric(["continuation"], pressure.continuations_lost)
        lost.add_metric(["engine_report"], pressure.reports_lost)
        yield checks
        yield lost
        yield GaugeMetricFamily(
            "kvroute_route_cache_pressure",
            "hit-loss rate, exponentially weighted (the share term's cache-pressure gate)",
            value=pressure.loss_rate,
        )
        yield GaugeMetricFamily(
            "kvroute_route_share_weight",
            "the fair-share term's weight now, in times its full weight (share_roomy where "
            "nothing is lost or queued, share_evicting where caches evict and nothing queues)",
            value=core.share_weight(),
        )
        yield GaugeMetricFamily(
            "kvroute_route_queue_depth",
            "mean prefill backlog per worker in requests' worth, exponentially weighted",
            value=pressure.queue_depth,
        )


def reset_routing(
    service: RouterService,
    config: RoutingConfig | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> RoutingCore:
    """Replace the routing state (in-flight table, predictions) with a fresh core, e.g.
    between the policy runs of ``kvroute demo`` (which also passes its virtual clock);
    ``config`` defaults to the settings'."""
    core = RoutingCore(config or routing_config(service.settings), clock=clock)
    service.routing = core  # type: ignore[attr-defined]
    collector: _RoutingCollector | None = getattr(service, "_routing_collector", None)
    if collector is not None:
        collector.core = core
    return core


def install(app: FastAPI, service: RouterService) -> None:
    """Attach a ``RoutingCore`` to ``service`` and add the routing endpoints to ``app``."""
    core = reset_routing(service)
    app.include_router(router)
    if getattr(service, "_routing_collector", None) is None:
        collector = _RoutingCollector(core)
        service.metrics.registry.register(collector)
        service._routing_collector = collector  # type: ignore[attr-defined]
        # An engine's cache reset reaches whichever core is current (reset_routing
        # replaces it): its share of recent requests is forgotten.
        service.ingestor.on_clear.append(
            lambda worker_id: service.routing.caches_cleared(  # type: ignore[attr-defined]
                worker_id, service.worker_ids()
            )
        )

    async def expire_loop() -> None:
        # Lazy expiry runs on every route/finish; this also frees load when idle.
        while True:
            await asyncio.sleep(EXPIRE_INTERVAL_S)
            service.routing.expire()  # type: ignore[attr-defined]

    service.add_background(expire_loop)
