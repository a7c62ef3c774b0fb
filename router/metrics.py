"""Prometheus metrics of one router (``kvroute_*``), in a registry of its own.

Why a custom collector instead of Counter objects: the hot paths (ingest, subscriber)
keep plain int counters, and the collector reads them only when ``/metrics`` is scraped,
so a block event costs an integer increment, not a labelled-metric lookup. Values that
need the index (entry counts, blocks per group and tier) are refreshed asynchronously
just before each scrape, because a collector itself must not await.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Protocol

from prometheus_client import (
    CollectorRegistry,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from router.index.base import IndexUnavailable
from router.ratelimited_log import RateLimitedLog

if TYPE_CHECKING:
    from router.index.base import IndexBackend
    from router.ingest.index_watch import IndexWatch
    from router.ingest.ingestor import Ingestor
    from router.ingest.listener import TopicListener


class Subscriptions(Protocol):
    """What the collector reads of the subscriptions: each worker's transport state."""

    def all(self) -> list[Any]: ...


log = logging.getLogger(__name__)
_limited = RateLimitedLog(log)
# `*_created` samples (a timestamp per metric) only confuse dashboards here.
disable_created_metrics()

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
STATES = ("connecting", "connected", "resyncing", "disconnected", "conflict")

# (metric suffix, WorkerCounters field, help)
_WORKER_COUNTERS = (
    ("batches", "batches", "KV event batches applied to the index"),
    ("events", "events", "KV events applied to the index"),
    ("gaps", "gaps", "sequence gaps detected on the live stream"),
    ("replays", "replays", "replay requests sent to the publisher"),
    ("replay_failures", "replay_failures", "replay requests that timed out or failed"),
    ("resyncs", "resyncs", "times the worker's entries were cleared and rebuilt"),
    ("decode_errors", "decode_errors", "undecodable frames skipped"),
    ("duplicate_batches", "duplicates", "batches skipped as already applied (replay overlap)"),
    ("ingest_retries", "ingest_retries", "index writes retried while the index was down"),
    ("ingest_errors", "ingest_errors", "index writes that failed (not an outage): repaired"),
    ("tail_checks", "tail_checks", "idle-time replay asks for frames lost at the tail"),
    ("replay_overflows", "replay_overflows", "replay answers dropped for exceeding the bounds"),
    ("task_restarts", "task_restarts", "subscription tasks restarted after a failure"),
    ("reopened_connections", "reopened", "connections ZMQ ended for good, connected again"),
)
# (metric suffix, DecodeStats field, help)
_DECODE_COUNTERS = (
    ("unknown_events", "unknown_event_types", "events of an unknown type, skipped"),
    ("unknown_fields", "unknown_fields", "unknown event/batch fields, ignored"),
    ("legacy_events", "legacy_events", "positional-array (legacy/SGLang) events decoded"),
    ("malformed_events", "malformed_events", "events with bad field types, skipped"),
)
_INDEX_GAUGES = {
    "workers": "workers with data in the index",
    "entries": "(worker, group, block) entries in the index",
    "map_entries": "engine hash -> block key map entries",
    "bytes": "estimated index size in bytes",
}


class RouterMetrics:
    """The registry, the score-latency histogram and the scrape-time collector."""

    def __init__(
        self,
        index: IndexBackend,
        ingestor: Ingestor,
        subscriptions: Subscriptions,
        index_watch: Callable[[], IndexWatch | None] = lambda: None,
        listener: Callable[[], TopicListener | None] = lambda: None,
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.score_latency = Histogram(
            "kvroute_score_duration_seconds",
            "time to compute one /v1/score answer (index fetch + HMA rule), in seconds",
            buckets=(0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.1, 0.5),
            registry=self.registry,
        )
        self._collector = _ServiceCollector(ingestor, subscriptions, index_watch, listener)
        self.registry.register(self._collector)
        self._index = index
        self._ingestor = ingestor
        self._subscriptions = subscriptions

    async def refresh(self) -> None:
        """Fetch the index-side values the next scrape shows (best effort)."""
        try:
            stats = await self._index.stats()
            blocks: dict[str, dict[int, dict[str, int]]] = {}
            for sub in self._subscriptions.all():
                worker_id = sub.worker_id
                groups = await self._ingestor.worker_groups(worker_id)
                blocks[worker_id] = {g: dict(info.blocks_by_medium) for g, info in groups.items()}
        except IndexUnavailable:
            self._collector.index_up = False
            return
        except Exception:  # a wrong-typed key, a bug: the counters must stay scrapable
            _limited.exception(
                "refresh_failed",
                "/metrics: the index-side values could not be read; showing the last ones",
            )
            return
        self._collector.index_up = True
        self._collector.index_stats = stats
        self._collector.blocks = blocks

    async def render(self) -> bytes:
        await self.refresh()
        return generate_latest(self.registry)


class _ServiceCollector(Collector):
    def __init__(
        self,
        ingestor: Ingestor,
        subscriptions: Subscriptions,
        index_watch: Callable[[], IndexWatch | None],
        listener: Callable[[], TopicListener | None],
    ) -> None:
        self._ingestor = ingestor
        self._subscriptions = subscriptions
        self._index_watch = index_watch
        self._listener = listener
        self.index_up = True
        self.index_stats: dict[str, int | float | str] = {}
        self.blocks: dict[str, dict[int, dict[str, int]]] = {}

    def collect(self) -> Iterator[Metric]:
        subs = self._subscriptions.all()
        for suffix, attr, help_ in _WORKER_COUNTERS:
            fam = CounterMetricFamily(f"kvroute_{suffix}", help_, labels=["worker"])
            for sub in subs:
                fam.add_metric([sub.worker_id], getattr(sub.counters, attr))
            yield fam
        for suffix, attr, help_ in _DECODE_COUNTERS:
            fam = CounterMetricFamily(f"kvroute_{suffix}", help_, labels=["worker"])
            for sub in subs:
                fam.add_metric([sub.worker_id], getattr(sub.decode_stats, attr))
            yield fam

        state = GaugeMetricFamily(
            "kvroute_worker_state", "1 for the worker's current state", labels=["worker", "state"]
        )
        lag = GaugeMetricFamily(
            "kvroute_ingest_lag_seconds",
            "how long the batch being applied has waited for the index (0 when none)",
            labels=["worker"],
        )
        last_seq = GaugeMetricFamily(
            "kvroute_last_seq", "last applied seq per DP rank", labels=["worker", "rank"]
        )
        silent = GaugeMetricFamily(
            "kvroute_worker_silent",
            "1 when the worker sent no batch within silent_after_s of registration",
            labels=["worker"],
        )
        faulted = GaugeMetricFamily(
            "kvroute_worker_faulted",
            "1 while a failed index write is being repaired (clear and replay)",
            labels=["worker"],
        )
        partial = GaugeMetricFamily(
            "kvroute_worker_partial_history",
            "1 when the worker was rebuilt from a buffer that did not reach seq 0 "
            "(estimates are lower bounds)",
            labels=["worker"],
        )
        for sub in subs:
            partial.add_metric([sub.worker_id], 1.0 if sub.partial_history else 0.0)
            silent.add_metric([sub.worker_id], 1.0 if sub.silent else 0.0)
            faulted.add_metric([sub.worker_id], 1.0 if sub.faulted else 0.0)
            current = sub.state
            for s in STATES:
                state.add_metric([sub.worker_id, s], 1.0 if s == current else 0.0)
            lag.add_metric([sub.worker_id], sub.lag_seconds())
            for rank, seq in sub.last_seq.items():
                last_seq.add_metric([sub.worker_id, str(rank)], seq)
        yield state
        yield lag
        yield last_seq
        yield silent
        yield partial
        watch = self._index_watch()
        yield CounterMetricFamily(
            "kvroute_index_losses",
            "times the shared index was found without the registered workers (restarted "
            "empty or flushed); every worker was then resynced",
            value=watch.losses if watch is not None else 0,
        )
        yield CounterMetricFamily(
            "kvroute_index_watch_errors",
            "index content checks that failed other than by an outage (e.g. a wrong-typed "
            "key): a loss cannot be noticed while they fail",
            value=watch.errors if watch is not None else 0,
        )
        yield faulted
        yield GaugeMetricFamily("kvroute_workers", "registered workers", value=len(subs))
        listener = self._listener()
        yield CounterMetricFamily(
            "kvroute_listener_unusable_frames",
            "frames on --listen whose topic names no worker it can serve (logged rate-limited)",
            value=listener.unknown_topics if listener is not None else 0,
        )
        yield CounterMetricFamily(
            "kvroute_listener_dispatch_errors",
            "frames on --listen whose handling failed unexpectedly (logged rate-limited)",
            value=listener.dispatch_errors if listener is not None else 0,
        )

        for name, value in self._ingestor.counters.as_dict().items():
            yield CounterMetricFamily(
                f"kvroute_ingest_{name}", f"ingest counter {name} (all workers)", value=value
            )

        yield GaugeMetricFamily(
            "kvroute_index_up", "1 when the index backend answered", value=float(self.index_up)
        )
        for key, help_ in _INDEX_GAUGES.items():
            stat = self.index_stats.get(key)
            if isinstance(stat, int | float):
                yield GaugeMetricFamily(f"kvroute_index_{key}", help_, value=stat)
        blocks = GaugeMetricFamily(
            "kvroute_worker_blocks",
            "indexed blocks per worker, group and medium",
            labels=["worker", "group", "medium"],
        )
        for worker_id, groups in self.blocks.items():
            for g, by_medium in groups.items():
                for medium, n in by_medium.items():
                    blocks.add_metric([worker_id, str(g), medium], n)
        yield blocks
