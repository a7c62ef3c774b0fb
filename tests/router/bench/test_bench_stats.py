"""The benchmarks' one percentile: nearest rank, no interpolation, 0 for no samples."""

from benchmarks.stats import pct, pct_ms


def test_nearest_rank_not_interpolated() -> None:
    samples = [5.0, 1.0, 3.0, 2.0, 4.0]
    assert pct(samples, 0.5) == 3.0
    assert pct(samples, 0.99) == 5.0  # a sample that was seen, never beyond the largest
    assert pct(samples, 0.0) == 1.0
    assert pct(list(range(200)), 0.99) == 198


def test_empty_and_milliseconds() -> None:
    assert pct([], 0.99) == 0.0
    assert pct_ms([0.0012345, 0.002], 0.5) == 2.0
    assert pct_ms([0.0012345], 0.5) == 1.234  # rounded to the microsecond
