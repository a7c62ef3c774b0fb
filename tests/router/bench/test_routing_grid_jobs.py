"""benchmarks/routing_grid.py --jobs: cells side by side give the grid one at a time gives.

Each cell is simulated time in one process, so running cells in parallel processes must
change nothing but the wall time: the same figures, in the same (grid) order, in the JSON.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]


def _grid(tmp_path: Path, jobs: int) -> list[dict[str, Any]]:
    out = tmp_path / f"grid_{jobs}.json"
    subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks/routing_grid.py"),
            *("--workloads", "chat", "--workers", "8", "--caches", "tight,generous"),
            *("--loads", "0.9", "--policies", "kv_aware", "--jobs", str(jobs)),
            *("--reuse", str(ROOT / "benchmarks/results/routing_grid_synthetic.json")),
            *("--out", str(out)),
        ],
        check=True,
        capture_output=True,
        cwd=ROOT,
    )
    return json.loads(out.read_text())


def test_parallel_cells_give_the_serial_grid_in_grid_order(tmp_path: Path) -> None:
    serial = _grid(tmp_path, 1)
    parallel = _grid(tmp_path, 2)
    assert [c["cache"] for c in parallel] == ["tight", "generous"]
    for a, b in zip(serial, parallel, strict=True):
        assert (a["workload"], a["workers"], a["cache"], a["load"]) == (
            b["workload"],
            b["workers"],
            b["cache"],
            b["load"],
        )
        assert a["policies"] == b["policies"]
        assert b["reused_from_previous_run"] == [
            "dynamo",
            "sglang",
            "sglang_smg",
            "llmd",
            "round_robin",
        ]
