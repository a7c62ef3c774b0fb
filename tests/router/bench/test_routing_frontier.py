"""benchmarks/routing_frontier.py: the weight settings a sweep runs."""

from __future__ import annotations

from benchmarks.routing_frontier import anchor_settings, settings, verdicts


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


def test_verdicts_count_the_settings_ahead_of_each_anchor_point() -> None:
    def m(hit: float, p99: float) -> dict[str, float]:
        return {"hit_rate": hit, "ttft_p99_s": p99}

    result = {
        "splits": {
            "report": {
                "kv_aware": {"": m(0.30, 10.0), "held=0": m(0.32, 12.0)},
                "anchors": {"llmd": m(0.31, 11.0), "dynamo": m(0.29, 9.0)},
                "anchor_settings": {"llmd": {"kv_weight=1": m(0.305, 9.5)}},
            }
        }
    }
    lines = verdicts(result)
    assert len(lines) == 3
    dynamo = next(x for x in lines if " dynamo " in x)
    assert "ahead on both: 0/2" in dynamo and "kv_aware's defaults" not in dynamo  # fewer hits
    llmd = next(x for x in lines if " llmd " in x)
    assert "ahead on both: 0/2" in llmd and "kv_aware's defaults" not in llmd
    swept = next(x for x in lines if "llmd kw 1" in x)
    assert "ahead of kv_aware's defaults on both" in swept
    result["splits"]["report"]["kv_aware"]["held=0"] = m(0.31, 10.0)
    assert "ahead on both: 1/2" in next(x for x in verdicts(result) if " llmd " in x)
