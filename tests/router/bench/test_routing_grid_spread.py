"""benchmarks/routing_grid_spread.py: its command line, and the verdict over runs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.routing_grid_spread import ANCHORS, parse_args

SCRIPT = Path(__file__).resolve().parents[3] / "benchmarks" / "routing_grid_spread.py"


def test_help_prints_usage_instead_of_opening_a_file_named_help() -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert "GRID_JSON" in done.stdout


def test_no_grid_is_a_usage_error() -> None:
    with pytest.raises(SystemExit) as exc:
        parse_args([])
    assert exc.value.code == 2


def _grid(path: Path, kv_hit: float, kv_p99: float) -> str:
    anchors = {a: {"hit_rate": 0.30, "ttft_p99_s": 8.0} for a in ANCHORS}
    cell = {
        "workload": "mooncake",
        "workers": 8,
        "cache": "tight",
        "load": 0.5,
        "policies": {"kv_aware": {"hit_rate": kv_hit, "ttft_p99_s": kv_p99}, **anchors},
    }
    path.write_text(json.dumps([cell]))
    return str(path)


def test_ahead_on_the_mean_but_not_in_every_run(tmp_path: Path) -> None:
    grids = [
        _grid(tmp_path / "a.json", 0.31, 7.0),
        _grid(tmp_path / "b.json", 0.295, 7.5),  # behind on hits in this run only
    ]
    done = subprocess.run(
        [sys.executable, str(SCRIPT), *grids], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert "| yes | no |" in done.stdout
    assert "ahead on the mean of 2 seeds: 1/1 cells; in every seed: 0/1" in done.stdout
