"""benchmarks/routing_frontier.py: the weight settings a sweep runs."""

from __future__ import annotations

from benchmarks.routing_frontier import settings


def test_every_combination_of_the_sweeps_is_one_weights_string() -> None:
    assert settings(["backlog_large=0,0.01", "held_large=0,0.02"]) == [
        "backlog_large=0,held_large=0",
        "backlog_large=0,held_large=0.02",
        "backlog_large=0.01,held_large=0",
        "backlog_large=0.01,held_large=0.02",
    ]
    assert settings(["share=1"]) == ["share=1"]
    assert settings([]) == [""]
