"""benchmarks/routing_live_trace.py splits a run's reuse into placement and admission."""

from __future__ import annotations

from benchmarks.routing_live_trace import peak_sessions, summarize


def turn(conv: int, t: int, start: float, worker: str, est: int, cached: int) -> dict:
    return {
        "repeat": 0, "way": "kv_aware", "conversation": conv, "turn": t, "start_s": start,
        "ttft_s": 0.1, "prompt": 100, "cached": cached, "worker": worker, "estimated": est,
    }  # fmt: skip


def test_hits_lost_before_admission_are_told_apart_from_placement() -> None:
    rows = [
        turn(0, 0, 0.0, "e0", 0, 0),
        turn(0, 1, 1.0, "e0", 80, 80),
        turn(1, 0, 0.0, "e1", 0, 0),
        turn(1, 1, 1.0, "e0", 80, 20),  # moved, and 60 of its 80 evicted while waiting
    ]
    (s,) = summarize(rows)
    assert s["reuse"] == 0.25 and s["estimated"] == 0.4
    assert s["lost_before_admission"] == 60 and s["most_lost_on"] == "e0"
    assert s["moves"] == 1
    # From t=1.0 both conversations are on e0 (their last turns run to their first token).
    assert s["peak_sessions_per_worker"] == 2


def test_a_worker_serves_a_conversation_until_its_next_turn_starts() -> None:
    rows = [turn(0, 0, 0.0, "e0", 0, 0), turn(0, 1, 5.0, "e1", 0, 0), turn(1, 0, 4.0, "e0", 0, 0)]
    assert peak_sessions(rows) == 2  # conversation 0 still counts on e0 at t=4
    rows[2]["start_s"] = 5.2
    assert peak_sessions(rows) == 1


def test_a_way_through_the_proxy_may_name_a_route_profile() -> None:
    from benchmarks.routing_live import ROUTED, policy_of

    assert policy_of("kv_aware@few-sessions") == "kv_aware" in ROUTED
    assert policy_of("pinned") == "pinned" and policy_of("vllm-router") not in ROUTED
