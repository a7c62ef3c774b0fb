"""benchmarks/routing_trace.py: its printed availability (what was cached anywhere when
each request arrived) is the one its decision rows give, for every policy traced.

Round 20 split a hit-rate gap into availability, moves and losses while queued from these
lines, so they must say what the rows say.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_the_availability_line_matches_the_decision_rows(tmp_path: Path) -> None:
    out = tmp_path / "trace.jsonl"
    run = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks/routing_trace.py"),
            *("--workload", "chat", "--workers", "8", "--cache", "tight", "--load", "0.9"),
            *("--policies", "kv_aware,llmd", "--out", str(out)),
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=600,
    )
    rows: dict[str, list[dict[str, int]]] = defaultdict(list)
    for line in out.read_text().splitlines():
        row = json.loads(line)
        rows[row["policy"]].append(row)
    printed = re.findall(
        r"^(\S+) +hit .*\n +available on arrival \(cached anywhere\): ([\d.]+)% of prompt "
        r"tokens; prompts of 64k\+ tokens: (\d+),",
        run.stdout,
        re.MULTILINE,
    )
    assert [p for p, _, _ in printed] == ["kv_aware", "llmd"]
    for policy, available, long in printed:
        mine = rows[policy]
        expected = sum(r["best_hit"] for r in mine) / sum(r["n"] for r in mine) * 100
        assert float(available) == round(expected, 2)
        assert int(long) == sum(1 for r in mine if r["n"] >= 65_536)
        assert 0 < expected < 100  # chat turns continue conversations: some is cached
