"""The charged engine model: step costs, held blocks, decode slowdown, speeds, the CLI."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from offload_core.kv_cache import KVCacheManager
from router.bench import main
from router.bench.charged import ChargedEngine, ChargedModel, EngineNotes
from schemas.hit_rule import GroupSpec

TRACE = Path(__file__).resolve().parents[3] / "benchmarks/data/mooncake_conversation_trace.jsonl"
GROUPS = [GroupSpec("full_attention", 16)]
# Round numbers: 1 s per step, 1 s per prefill token, nothing else.
UNIT = ChargedModel(
    step_s=1.0, prefill_token_s=1.0, attn_s=0.0, kv_read_s=0.0, seq_s=0.0, max_batched_tokens=64
)


def engine(blocks: int = 64, model: ChargedModel = UNIT, speed: float = 1.0) -> ChargedEngine:
    return ChargedEngine(KVCacheManager(GROUPS, blocks), model, speed)


def submit(e: ChargedEngine, rid: str, t: float, tokens: list[int], out: int) -> None:
    e.submit(rid, t, e.kv.make_request(tokens), out)


def test_chunked_prefill_then_decode_timeline() -> None:
    e = engine()
    submit(e, "a", 0.0, list(range(100)), out=3)
    notes = EngineNotes()
    e.run_until(float("inf"), notes)
    # 100 tokens in chunks of 64 + 36: two steps of 1 + 64 and 1 + 36 s.
    assert notes.first_tokens == [(102.0, "a", 102.0)]
    # Two more tokens: two decode steps of 1 s each.
    assert notes.finished == [(104.0, "a", 1.0)]
    assert notes.admitted == [("a", 0, 0)]


def test_a_cached_prefix_is_hit_at_admission_and_speed_divides_time() -> None:
    e = engine(speed=2.0)
    submit(e, "a", 0.0, list(range(64)), out=1)
    notes = EngineNotes()
    e.run_until(float("inf"), notes)
    submit(e, "b", 100.0, list(range(80)), out=1)
    e.run_until(float("inf"), notes)
    assert notes.admitted[1] == ("b", 64, 64)
    # 16 uncached tokens + 1 s step, at twice the speed.
    assert notes.first_tokens[1] == (108.5, "b", 8.5)


def test_running_requests_hold_blocks_so_admission_waits() -> None:
    e = engine(blocks=8)  # 8 blocks of 16 tokens
    submit(e, "long", 0.0, list(range(100)), out=50)  # 7 blocks held while decoding
    submit(e, "next", 0.0, list(range(1000, 1060)), out=1)  # needs 4 blocks
    notes = EngineNotes()
    e.run_until(float("inf"), notes)
    finished = {rid: t for t, rid, _ in notes.finished}
    first = {rid: t for t, rid, _ in notes.first_tokens}
    assert first["next"] > finished["long"]  # admitted only once "long" let go
    assert not notes.rejected


def test_a_prompt_larger_than_the_pool_is_rejected_not_queued_forever() -> None:
    e = engine(blocks=2)
    submit(e, "huge", 0.0, list(range(100)), out=1)
    notes = EngineNotes()
    e.run_until(float("inf"), notes)
    assert notes.rejected == ["huge"] and not e.waiting


def test_decode_slows_with_batch_and_context() -> None:
    model = ChargedModel()

    def tpot(batch: int, tokens: int) -> float:
        e = engine(blocks=4096, model=model)
        for i in range(batch):
            submit(e, f"r{i}", 0.0, [i * 100_000 + j for j in range(tokens)], out=200)
        notes = EngineNotes()
        e.run_until(float("inf"), notes)
        return max(t for _, _, t in notes.finished)

    assert tpot(32, 256) > tpot(1, 256)
    assert tpot(8, 4096) > tpot(8, 256)


def test_fast_forward_stops_at_the_next_arrival() -> None:
    e = engine()
    submit(e, "a", 0.0, list(range(10)), out=100)
    notes = EngineNotes()
    e.run_until(50.0, notes)  # prefill ends at 11, then 1 s decode steps
    assert e.clock == 51.0 and not notes.finished
    submit(e, "b", 50.0, list(range(500, 510)), out=1)
    e.run_until(float("inf"), notes)
    first = {rid: t for t, rid, _ in notes.first_tokens}
    assert first["b"] == 51.0 + 1 + 10  # joined the step after its arrival


def test_busy_time_counts_steps_not_idle_gaps() -> None:
    e = engine()
    submit(e, "a", 0.0, list(range(10)), out=3)  # 1 + 10 s prefill, then 2 decode steps
    notes = EngineNotes()
    e.run_until(float("inf"), notes)
    assert e.busy_s == 13.0
    submit(e, "b", 100.0, list(range(500, 510)), out=1)  # idle from 13 to 100
    e.run_until(float("inf"), notes)
    assert e.clock == 111.0 and e.busy_s == 24.0


def test_long_prefill_threshold_lets_a_cached_turn_past_a_long_prefill() -> None:
    """vLLM's --long-prefill-token-threshold: a long prompt in chunked prefill takes at
    most the threshold per step while anything else is running or waiting."""

    def first_tokens(threshold: int) -> dict[str, float]:
        model = ChargedModel(
            step_s=1.0, prefill_token_s=1.0, attn_s=0.0, kv_read_s=0.0, seq_s=0.0,
            max_batched_tokens=64, long_prefill_token_threshold=threshold,
        )  # fmt: skip
        e = engine(blocks=256, model=model)
        submit(e, "long", 0.0, list(range(1000)), out=1)
        notes = EngineNotes()
        e.run_until(0.5, notes)  # the long prompt's first chunk is under way
        submit(e, "turn", 0.5, list(range(5000, 5010)), out=1)
        e.run_until(float("inf"), notes)
        return {rid: ttft for _, rid, ttft in notes.first_tokens}

    # Off (vLLM's default): the turn waits for the whole long prefill (16 steps of 64).
    off = first_tokens(0)
    assert off["turn"] > off["long"] - 1
    # 32: the long prompt takes 32 tokens a step, the turn's 10 go in the next step.
    on = first_tokens(32)
    assert on["turn"] == pytest.approx(1 + 64 + 1 + 32 + 10 - 0.5)
    assert on["long"] > off["long"]  # the long prompt pays for it


def test_long_prefill_threshold_does_not_cap_a_request_alone() -> None:
    model = ChargedModel(
        step_s=1.0, prefill_token_s=1.0, attn_s=0.0, kv_read_s=0.0, seq_s=0.0,
        max_batched_tokens=64, long_prefill_token_threshold=16,
    )  # fmt: skip
    e = engine(model=model)
    submit(e, "a", 0.0, list(range(100)), out=1)
    notes = EngineNotes()
    e.run_until(float("inf"), notes)
    assert notes.first_tokens == [(102.0, "a", 102.0)]  # as without the threshold


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    assert main([*argv, "--trace", str(TRACE), "--json"]) == 0
    return json.loads(capsys.readouterr().out)  # type: ignore[no-any-return]


def test_bench_charged_with_the_anchors(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["routing", "--limit", "150", "--workers", "4", "--jobs", "1"]
    argv += ["--engine-model", "charged", "--load", "0.8", "--worker-speeds", "1,0.5"]
    argv += ["--long-prefill-threshold", "2048"]
    for p in ("kv_aware", "dynamo", "sglang", "sglang_smg", "llmd"):
        argv += ["--policy", p]
    result = run(capsys, *argv)
    assert result["config"]["engine_model"] == "charged"
    assert result["config"]["charged"]["long_prefill_token_threshold"] == 2048
    assert "load 0.8" in result["config"]["workload"]
    bounds = result["bounds"]
    for name, m in result["policies"].items():
        assert m["requests"] == 150 and m["unfinished"] == 0, name
        assert 0 < m["hit_rate"] <= bounds["infinite_cache"], name
        assert m["ttft_p50_s"] <= m["ttft_p99_s"], name
        assert m["tpot_mean_s"] > 0
        assert m["busy_imbalance"] >= 1.0, name  # max / mean of engine-seconds
        # The routing core's state as each request saw it: at load 0.8 on four workers
        # some are busy some of the time, never all of them all the time.
        assert 0.0 < m["idle_share_mean"] < 1.0, name
        assert 0.0 <= m["loss_rate_mean"] <= 1.0, name


def test_bench_slice_and_load(capsys: pytest.CaptureFixture[str]) -> None:
    base = ["routing", "--limit", "200", "--workers", "2", "--jobs", "1", "--policy", "kv_aware"]
    half = run(capsys, *base, "--slice", "0.5:1")
    assert half["policies"]["kv_aware"]["requests"] == 100
    with pytest.raises(SystemExit):
        main([*base, "--slice", "1:0.5", "--trace", str(TRACE)])
    loaded = run(capsys, *base, "--load", "0.5")
    assert "load 0.5 (arrivals x" in loaded["config"]["workload"]


def test_the_table_shows_busy_time_imbalance_for_charged_engines(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "200")  # one line per row: the header is not wrapped
    base = ["routing", "--limit", "60", "--workers", "2", "--jobs", "1", "--policy", "kv_aware"]
    base += ["--trace", str(TRACE)]
    assert main([*base, "--engine-model", "charged"]) == 0
    assert "tokens / busy" in capsys.readouterr().out
    assert main(base) == 0  # the simple model has no engine time to report
    assert "tokens / busy" not in capsys.readouterr().out
