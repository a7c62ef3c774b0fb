"""``/metrics`` of the simulated engine: the vLLM 0.33 series routers and dashboards read
(split from ``engine_openai``, the request and response bodies)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

if TYPE_CHECKING:
    from offload_core.engine import SimEngine


class VllmMetrics:
    """``/metrics``: the vLLM 0.33 series routers and dashboards read, named and labelled
    as in ``vllm/v1/metrics/loggers.py``. ``load``: the app's request gauges and totals."""

    def __init__(self, engine: SimEngine, model: str, load: dict[str, int]) -> None:
        self.engine, self.model, self.load = engine, model, load

    def collect(self) -> Iterator[Metric]:
        labels, values = ["model_name", "engine"], [self.model, "0"]
        pool, s, load = self.engine.kv.pool, self.engine.stats, self.load
        usage = 1.0 - pool.num_free_blocks / max(pool.num_blocks - 1, 1)
        for kind, name, value, doc in (
            (GaugeMetricFamily, "num_requests_running", load["running"], "Requests running."),
            (GaugeMetricFamily, "num_requests_waiting", load["waiting"], "Requests waiting."),
            (GaugeMetricFamily, "kv_cache_usage_perc", usage, "KV-cache usage (1 = 100%)."),
            (CounterMetricFamily, "prompt_tokens", s.prompt_tokens, "Prefill tokens."),
            (CounterMetricFamily, "generation_tokens", load["tokens"], "Generated tokens."),
            (CounterMetricFamily, "prefix_cache_queries", s.prompt_tokens, "Tokens queried."),
            (CounterMetricFamily, "prefix_cache_hits", s.gpu_cached_tokens, "Tokens hit (GPU)."),
            (CounterMetricFamily, "prompt_tokens_cached", s.cached_tokens, "GPU + CPU hits."),
        ):
            metric = kind(f"vllm:{name}", doc, labels=labels)
            metric.add_metric(values, value)
            yield metric
        done = CounterMetricFamily(
            "vllm:request_success", "Finished requests.", labels=[*labels, "finished_reason"]
        )
        done.add_metric([*values, "length"], load["finished"])
        yield done
