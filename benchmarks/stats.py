"""Percentiles as every benchmark here reports them.

Why one place: the benchmarks' tables compare figures across scripts, so they must all
take a percentile the same way -- the nearest rank at or above ``q`` of the samples, no
interpolation (a p99 over 200 samples is a sample that was seen).
"""

from __future__ import annotations

from collections.abc import Sequence


def pct(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values`` by nearest rank; 0.0 for no samples."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def pct_ms(seconds: Sequence[float], q: float) -> float:
    """``pct`` of durations in seconds, in milliseconds rounded to the microsecond."""
    return round(pct(seconds, q) * 1e3, 3)
