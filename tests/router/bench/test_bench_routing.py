"""``kvroute bench routing`` / ``hma`` on small slices: structure and sane invariants."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from router.bench import main
from router.bench.trace_replay import FleetSpec, ReplayConfig, replay
from router.bench.workloads import SyntheticConfig, synthetic_workload
from router.routing.state import RoutingConfig
from schemas.hit_rule import GroupSpec

TRACE = Path(__file__).resolve().parents[3] / "benchmarks/data/mooncake_conversation_trace.jsonl"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    assert main([*argv, "--trace", str(TRACE), "--json"]) == 0
    return json.loads(capsys.readouterr().out)  # type: ignore[no-any-return]


def test_bench_routing_on_the_first_200_lines(capsys: pytest.CaptureFixture[str]) -> None:
    result = run(capsys, "routing", "--limit", "200", "--workers", "4", "--jobs", "1")
    policies = result["policies"]
    assert list(policies) == ["kv_aware", "round_robin", "least_loaded", "longest_prefix"]
    bounds = result["bounds"]
    assert 0 < bounds["shared_cache"] <= bounds["infinite_cache"] < 1
    for name, m in policies.items():
        assert m["requests"] == 200 and m["rejected"] == 0, name
        assert 0 <= m["hit_rate"] <= bounds["infinite_cache"], name
        assert m["imbalance"] >= 1.0
        # Events reach the index before the next request: estimates are exact.
        assert m["estimate_exact"] == 1.0 and m["estimate_mae_tokens"] == 0, name
        assert m["prefill_tokens_saved"] <= m["prompt_tokens"]
    assert policies["kv_aware"]["hit_rate"] >= policies["round_robin"]["hit_rate"]
    assert policies["kv_aware"]["hit_rate"] > 0
    # Block 0 is in every prompt: the classic prefix router piles everything on one worker.
    assert policies["longest_prefix"]["imbalance"] > 3
    assert result["config"]["requests"] == 200 and result["config"]["gpu_blocks"] == 1024


def test_bench_is_deterministic_across_job_splits(capsys: pytest.CaptureFixture[str]) -> None:
    args = ("routing", "--limit", "60", "--workers", "3", "--gpu-blocks", "64")
    one = run(capsys, *args, "--jobs", "1", "--policy", "kv_aware", "--policy", "random")
    two = run(capsys, *args, "--jobs", "2", "--policy", "kv_aware", "--policy", "random")
    assert one["policies"] == two["policies"]
    assert one["bounds"] == two["bounds"]
    assert two["config"]["jobs"] == 2


def test_bench_hma_exact_matches_the_engines(capsys: pytest.CaptureFixture[str]) -> None:
    result = run(capsys, "hma", "--limit", "120", "--workers", "3", "--gpu-blocks", "128")
    variants = result["policies"]
    assert list(variants) == ["hma_exact", "full_only", "all_full"]
    exact = variants["hma_exact"]
    # The HMA rule over the index equals the engines' own hits, for every worker.
    assert exact["estimate_exact"] == 1.0
    assert exact["estimate_exact_all_workers"] == 1.0
    for m in variants.values():
        assert 0 <= m["hit_rate"] <= result["bounds"]["infinite_cache"]
        assert "estimate_mae_all_workers" in m
    assert result["config"]["groups"][1]["kind"] == "sliding_window"


def test_bench_rejects_bad_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["routing", "--trace", "/nonexistent.jsonl", "--json"]) == 2
    assert "nonexistent" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["routing", "--weights", "nonsense=1"])


def test_bench_routing_runs_an_anchor_as_deployed(capsys: pytest.CaptureFixture[str]) -> None:
    """``--policy-setting`` reaches the anchor's object: llm-d with its prefix scorer
    weighed 0 routes by load alone and loses the hits its default keeps."""
    args = ("routing", "--limit", "200", "--workers", "4", "--jobs", "1", "--policy", "llmd")
    default = run(capsys, *args)
    blind = run(capsys, *args, "--policy-setting", "llmd:prefix_weight=0")
    assert blind["config"]["policy_settings"] == {"llmd": {"prefix_weight": 0.0}}
    assert "policy_settings" not in default["config"]
    assert blind["policies"]["llmd"]["hit_rate"] < default["policies"]["llmd"]["hit_rate"]
    assert main([*args, "--policy-setting", "llmd:kv=1", "--json"]) == 2
    assert "unknown setting(s) ['kv'] for policy 'llmd'" in capsys.readouterr().err


async def test_predicted_entries_keep_a_burst_together_before_events_arrive() -> None:
    # Fan-out bursts whose events reach the router half a second late.
    workload = synthetic_workload(SyntheticConfig(requests=150, seed=2, mix=(0.0, 0.0, 1.0)))
    routing = RoutingConfig(prefix_block_tokens=16, seed=0)
    cfg = ReplayConfig(
        workers=4,
        gpu_blocks=4096,
        groups=[GroupSpec("full_attention", 16)],
        event_delay_s=0.5,
        routing=routing,
    )
    no_predictions = RoutingConfig(prefix_block_tokens=16, predict_ttl_s=0.0, seed=0)
    fleets = [
        FleetSpec("predicted", "kv_aware"),
        FleetSpec("blind", "kv_aware", routing=no_predictions),
    ]
    result = await replay(workload, fleets, cfg)
    with_pred, blind = result["policies"]["predicted"], result["policies"]["blind"]
    assert with_pred["predicted_used"] > 50 and blind["predicted_used"] == 0
    assert with_pred["hit_rate"] > blind["hit_rate"] + 0.1


def test_bench_hma_shortcuts_mispredict_with_small_blocks(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = [
        "hma", "--synthetic", "200", "--block-size", "16", "--groups", "full:{bs},swa:{bs}:128",
        "--workers", "3", "--gpu-blocks", "768", "--jobs", "1", "--json",
    ]  # fmt: skip
    assert main(argv) == 0
    v = json.loads(capsys.readouterr().out)["policies"]
    assert v["hma_exact"]["estimate_exact_all_workers"] == 1.0
    # Ignoring the window over-predicts once old window blocks are gone; treating the
    # window as full attention under-predicts as soon as an old block is evicted.
    assert v["full_only"]["estimate_over"] > 0 and v["full_only"]["estimate_under"] == 0
    assert v["all_full"]["estimate_under"] > 0 and v["all_full"]["estimate_over"] == 0
    assert v["all_full"]["estimate_exact_all_workers"] < 0.9
