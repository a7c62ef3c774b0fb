"""``benchmarks/router.py`` end to end, small: real publishers, ZMQ, the router's
subscribers and writer, memory and Redis. The benchmark wraps the ingestor's write call
to time it; a wrapper that dropped the call's answer made every write fail and the run
never finish, which no test saw."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_quick_ingest_run_applies_every_event(redis_url: str) -> None:
    args = ["--quick", "--no-score", "--json", "--publishers", "2", "--redis-url", redis_url]
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "router.py"), *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    rows = json.loads(out.stdout)["ingest"]
    assert {r["backend"] for r in rows} == {"memory", "redis"}
    for r in rows:
        assert r["block_events"] > 0 and r["index_entries"] > 0
        assert (r["gaps"], r["resyncs"], r["publisher_dropped"]) == (0, 0, 0)
