"""``kvroute demo`` end to end: real engine processes, the router, a small workload."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from router.ops.demo import main


def test_small_demo_produces_table_chart_and_exact_estimates(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    png, out = tmp_path / "chart" / "demo.png", tmp_path / "demo.json"
    argv = [
        "--workers", "2", "--requests", "40", "--policies", "kv_aware,round_robin",
        "--gpu-blocks", "768", "--cpu-blocks", "128",
        "--out", str(png), "--json", str(out), "--quiet",
    ]  # fmt: skip
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "kvroute demo" in printed and "kv_aware" in printed and "round_robin" in printed
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    runs = {r["policy"]: r for r in json.loads(out.read_text())["policies"]}
    assert set(runs) == {"kv_aware", "round_robin"}
    for r in runs.values():
        assert r["requests"] == 40 and r["rejected"] == 0 and r["unsynced"] == 0
        # Lossless: the router's estimate is the engine's reported cached_tokens.
        assert r["estimate_exact"] == 1.0 and r["estimate_mae_tokens"] == 0
        assert 0 < r["hit_rate"] < 1
        assert sum(r["tokens_by_worker"].values()) == r["prompt_tokens"]
    assert runs["kv_aware"]["hit_rate"] >= runs["round_robin"]["hit_rate"]


def test_demo_rejects_unknown_policies(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--policies", "kv_aware,fastest"])
    assert "unknown policy" in capsys.readouterr().err
