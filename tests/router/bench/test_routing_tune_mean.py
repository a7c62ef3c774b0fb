"""benchmarks/routing_tune_mean.py: the tuning split's verdict on the mean of runs."""

from __future__ import annotations

from benchmarks.routing_tune_mean import parse, verdicts

RUN_1 = """\
  W mooncake|32|tight|0.9 hit 0.3051 (best 0.3043) p50 0.37 (best 0.53) p99 9.43 (best 11.17)
  W mooncake|8|tight|0.5 hit 0.1807 (best 0.1648) p50 0.41 (best 0.53) p99 8.900 (best 8.810)
W          won 1/2 hit 2 p99 1 worst hit gap -0.24pt worst p99 x1.01 max imbalance 1.29 | p50 2
"""
RUN_2 = """\
  W mooncake|32|tight|0.9 hit 0.3001 (best 0.3043) p50 0.37 (best 0.53) p99 9.43 (best 11.17)
  W mooncake|8|tight|0.5 hit 0.1807 (best 0.1648) p50 0.41 (best 0.53) p99 8.600 (best 8.810)
"""


def test_each_cell_is_judged_on_the_mean_of_its_runs() -> None:
    runs = parse([RUN_1, RUN_2])
    assert runs[("W", "mooncake|32|tight|0.9")] == [
        (0.3051, 0.3043, 9.43, 11.17),
        (0.3001, 0.3043, 9.43, 11.17),
    ]
    # N=32: hits 0.3026 on the mean, behind 0.3043 though ahead in one run; N=8: p99 8.75
    # on the mean, at or under 8.81 though behind in one run.
    assert verdicts(runs) == {"W": (1, 1, 2, 2)}
