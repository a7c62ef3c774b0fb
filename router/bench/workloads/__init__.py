"""Workloads for routing benchmarks and the demo: one ``Request`` type, two sources."""

from router.bench.workloads.base import DEFAULT_VOCAB, Request, segment_tokens
from router.bench.workloads.mooncake import MOONCAKE_BLOCK, MooncakeTrace, TraceRecord
from router.bench.workloads.synthetic import SyntheticConfig, iter_synthetic, synthetic_workload

__all__ = [
    "DEFAULT_VOCAB",
    "MOONCAKE_BLOCK",
    "MooncakeTrace",
    "Request",
    "SyntheticConfig",
    "TraceRecord",
    "iter_synthetic",
    "segment_tokens",
    "synthetic_workload",
]
