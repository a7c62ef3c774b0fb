"""Garbage-collector pause totals for ``benchmarks/proxy_cpu.py --gc``: on ``PYTHONPATH``
only for the router it starts. Every 5 s one line to stderr:
``GCSTAT g0:n=COUNT,ms=TOTAL,max=MAX g1:... g2:...`` (cumulative since start)."""

import gc
import sys
import threading
import time

_start = [0.0]
_totals = {0: [0, 0.0, 0.0], 1: [0, 0.0, 0.0], 2: [0, 0.0, 0.0]}


def _callback(phase: str, info: dict) -> None:
    if phase == "start":
        _start[0] = time.perf_counter()
        return
    ms = (time.perf_counter() - _start[0]) * 1000
    row = _totals[info["generation"]]
    row[0] += 1
    row[1] += ms
    row[2] = max(row[2], ms)


def _report() -> None:
    while True:
        time.sleep(5)
        parts = [f"g{g}:n={n},ms={ms:.0f},max={mx:.1f}" for g, (n, ms, mx) in _totals.items()]
        sys.stderr.write("GCSTAT " + " ".join(parts) + "\n")
        sys.stderr.flush()


gc.callbacks.append(_callback)
threading.Thread(target=_report, daemon=True).start()
