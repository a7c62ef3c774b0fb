"""The proxy's counters and their Prometheus export.

Plain ints on the hot path, read at scrape time. The proxy sees each response's
``usage.prompt_tokens_details.cached_tokens``, so it can say how good the router's
estimate was: per worker, estimated hit tokens vs engine-reported cached tokens, and the
share of recent responses where the two were equal ("exact").
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from router.proxy.warming import Warmed

if TYPE_CHECKING:
    from router.proxy.health import HealthMonitor

EXACT_WINDOW = 256


@dataclass(slots=True)
class WorkerCounters:
    routed: int = 0
    retried_away: int = 0
    upstream_errors: int = 0
    estimated_tokens: int = 0
    cached_tokens: int = 0
    compared: int = 0
    exact: int = 0
    recent_exact: deque[bool] = field(default_factory=lambda: deque(maxlen=EXACT_WINDOW))


class ProxyCounters:
    def __init__(self) -> None:
        self.workers: dict[str, WorkerCounters] = {}
        self.requests: Counter[tuple[str, str]] = Counter()  # (endpoint, outcome)
        self.recent_exact: deque[bool] = deque(maxlen=EXACT_WINDOW)
        self.untokenized = 0
        self.index_fallbacks = 0
        self.warm_requests = 0
        self.warm_ended: Counter[Warmed] = Counter()  # how each warming ended

    def warmed(self, sent: int, how: Warmed) -> None:
        self.warm_requests += sent
        self.warm_ended[how] += 1

    def worker(self, worker_id: str) -> WorkerCounters:
        c = self.workers.get(worker_id)
        if c is None:
            c = self.workers[worker_id] = WorkerCounters()
        return c

    def observe_cached(self, worker_id: str, estimated: int, cached: int) -> None:
        c = self.worker(worker_id)
        c.cached_tokens += cached
        c.compared += 1
        exact = estimated == cached
        c.exact += exact
        c.recent_exact.append(exact)
        self.recent_exact.append(exact)

    @staticmethod
    def share(window: deque[bool]) -> float | None:
        return sum(window) / len(window) if window else None

    def summary(self, health: HealthMonitor) -> dict[str, object]:
        """The dashboard's ``proxy`` section: per worker liveness, routing, failover
        (retried away, upstream errors, failed health checks) and estimate accuracy;
        fleet-wide the requests by outcome (cancelled by the client, upstream failed...)."""
        workers = {}
        for worker_id in health.service.worker_ids():
            c = self.worker(worker_id)
            h = health.workers.get(worker_id)
            why = health.why_not_live(worker_id)
            workers[worker_id] = {
                "live": why is None,
                "why_not_live": why,
                "routed": c.routed,
                "retried_away": c.retried_away,
                "upstream_errors": c.upstream_errors,
                "failed_checks": h.failed_checks if h is not None else 0,
                "estimated_tokens": c.estimated_tokens,
                "cached_tokens": c.cached_tokens,
                "exact_share": self.share(c.recent_exact),
            }
        outcomes: Counter[str] = Counter()
        for (_, outcome), n in self.requests.items():
            outcomes[outcome] += n
        return {
            "requests": sum(self.requests.values()),
            "outcomes": dict(outcomes),
            "exact_share": self.share(self.recent_exact),
            "workers": workers,
        }


class ProxyCollector(Collector):
    def __init__(self, counters: ProxyCounters, health: HealthMonitor) -> None:
        self.counters = counters
        self.health = health

    def collect(self) -> Iterator[Metric]:
        c = self.counters
        req = CounterMetricFamily(
            "kvroute_proxy_requests",
            "OpenAI requests through the proxy by endpoint and outcome",
            labels=["endpoint", "outcome"],
        )
        for (endpoint, outcome), n in sorted(c.requests.items()):
            req.add_metric([endpoint, outcome], n)
        yield req
        families = {
            "routed": CounterMetricFamily(
                "kvroute_proxy_routed", "requests forwarded to each worker", labels=["worker"]
            ),
            "retried_away": CounterMetricFamily(
                "kvroute_proxy_retries",
                "attempts that failed on a worker before the first byte and were retried "
                "on the next-best worker",
                labels=["worker"],
            ),
            "upstream_errors": CounterMetricFamily(
                "kvroute_proxy_upstream_errors",
                "connect errors, timeouts and 5xx from each worker",
                labels=["worker"],
            ),
            "estimated_tokens": CounterMetricFamily(
                "kvroute_proxy_estimated_hit_tokens",
                "the router's estimated cache-hit tokens of requests routed to each worker",
                labels=["worker"],
            ),
            "cached_tokens": CounterMetricFamily(
                "kvroute_proxy_cached_tokens",
                "engine-reported usage.prompt_tokens_details.cached_tokens per worker",
                labels=["worker"],
            ),
            "compared": CounterMetricFamily(
                "kvroute_proxy_estimates_compared",
                "responses that reported cached_tokens to compare the estimate with",
                labels=["worker"],
            ),
            "exact": CounterMetricFamily(
                "kvroute_proxy_estimates_exact",
                "responses whose cached_tokens equalled the router's estimate",
                labels=["worker"],
            ),
        }
        share = GaugeMetricFamily(
            "kvroute_proxy_estimate_exact_share",
            f"share of the last {EXACT_WINDOW} compared responses with an exact estimate",
            labels=["worker"],
        )
        live = GaugeMetricFamily(
            "kvroute_proxy_worker_live",
            "1 when the worker takes traffic (event stream connected and HTTP healthy)",
            labels=["worker"],
        )
        checks = CounterMetricFamily(
            "kvroute_proxy_health_check_failures", "failed HTTP health checks", labels=["worker"]
        )
        for worker_id in self.health.service.worker_ids():
            w = c.worker(worker_id)
            for name, family in families.items():
                family.add_metric([worker_id], getattr(w, name))
            s = c.share(w.recent_exact)
            if s is not None:
                share.add_metric([worker_id], s)
            live.add_metric([worker_id], float(self.health.why_not_live(worker_id) is None))
            checks.add_metric([worker_id], self.health.health(worker_id).failed_checks)
        fleet = c.share(c.recent_exact)
        if fleet is not None:
            share.add_metric(["_all"], fleet)
        yield from families.values()
        yield share
        yield live
        yield checks
        yield CounterMetricFamily(
            "kvroute_proxy_untokenized",
            "text prompts routed without a tokenizer for their model (load-only routing)",
            value=c.untokenized,
        )
        yield CounterMetricFamily(
            "kvroute_proxy_warm_requests",
            "prefix-warming requests sent to engines (the warm_chunk weight)",
            value=c.warm_requests,
        )
        ended = CounterMetricFamily(
            "kvroute_proxy_warmings",
            "warmed requests by how warming ended (done, failed: a warming request failed, "
            "evicted: the last warming request's blocks were gone)",
            labels=["outcome"],
        )
        for how in Warmed:
            ended.add_metric([how.value], c.warm_ended[how])
        yield ended
        yield CounterMetricFamily(
            "kvroute_proxy_index_fallbacks",
            "requests routed on load alone because the index was unavailable",
            value=c.index_fallbacks,
        )
