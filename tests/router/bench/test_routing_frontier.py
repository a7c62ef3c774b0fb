"""benchmarks/routing_frontier.py: the weight settings a sweep runs."""

from __future__ import annotations

from benchmarks.routing_frontier import anchor_settings, settings


def test_every_combination_of_the_sweeps_is_one_weights_string() -> None:
    assert settings(["backlog_large=0,0.01", "held_large=0,0.02"]) == [
        "backlog_large=0,held_large=0",
        "backlog_large=0,held_large=0.02",
        "backlog_large=0.01,held_large=0",
        "backlog_large=0.01,held_large=0.02",
    ]
    assert settings(["share=1"]) == ["share=1"]
    assert settings([]) == [""]


def test_an_anchor_sweep_is_every_combination_of_its_knobs_per_anchor() -> None:
    got = anchor_settings(["llmd:kv_weight=1,2", "llmd:queue_weight=3", "dynamo:host_hit_weight=1"])
    assert got == {
        "llmd": ["kv_weight=1,queue_weight=3", "kv_weight=2,queue_weight=3"],
        "dynamo": ["host_hit_weight=1"],
    }
    assert anchor_settings([]) == {}
