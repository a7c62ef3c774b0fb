"""Where a real-process run's reuse went: per repeat of ``routing_live.py --trace``.

A turn's hit is decided twice: when the router places it (its estimate, exact against
the index at that moment) and when the engine admits it (``cached_tokens``). What the
router estimated and the engine no longer had was evicted while the turn waited in the
engine's queue; a run whose reuse dips below its estimate lost its hits there, not in
placement. Per repeat and way: reuse, the routers' estimate, tokens lost before
admission (the worker that lost most, with its share of them), conversations that
changed worker between turns, and the most conversations any worker was serving at once.

    .venv/bin/python benchmarks/routing_live_trace.py TRACE.jsonl
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any


def peak_sessions(turns: Sequence[dict[str, Any]]) -> int:
    """The most conversations one worker served at once: a conversation counts on the
    worker of its turn from that turn's start to the next turn's start (the last turn:
    to its first token)."""
    by_conv: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for t in turns:
        by_conv[t["conversation"]].append(t)
    edges: list[tuple[float, int, str]] = []
    for conv in by_conv.values():
        conv.sort(key=lambda t: t["turn"])
        for t, nxt in zip(conv, [*conv[1:], None], strict=True):
            end = nxt["start_s"] if nxt is not None else t["start_s"] + t["ttft_s"]
            edges += [(t["start_s"], 1, t["worker"]), (end, -1, t["worker"])]
    live: Counter[str] = Counter()
    peak = 0
    for _, step, worker in sorted(edges, key=lambda e: (e[0], e[1])):
        live[worker] += step
        peak = max(peak, live[worker])
    return peak


def summarize(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """One summary per (repeat, way), in the trace's order."""
    groups: dict[tuple[int, str], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        groups[(r["repeat"], r["way"])].append(r)
    out = []
    for (rep, way), turns in groups.items():
        prompt = sum(t["prompt"] or 0 for t in turns)
        cached = sum(t["cached"] for t in turns)
        routed = [t for t in turns if t["estimated"] is not None]
        lost: Counter[str] = Counter()
        for t in routed:
            lost[t["worker"]] += max(0, t["estimated"] - t["cached"])
        by_conv: dict[int, list[dict[str, Any]]] = defaultdict(list)
        for t in turns:
            by_conv[t["conversation"]].append(t)
        moves = 0
        for conv in by_conv.values():
            conv.sort(key=lambda t: t["turn"])
            moves += sum(a["worker"] != b["worker"] for a, b in itertools.pairwise(conv))
        worst, worst_lost = lost.most_common(1)[0] if lost else ("-", 0)
        total_lost = sum(lost.values())
        out.append({
            "repeat": rep,
            "way": way,
            "reuse": round(cached / max(prompt, 1), 4),
            "estimated": round(sum(t["estimated"] for t in routed) / max(prompt, 1), 4)
            if routed else None,
            "lost_before_admission": total_lost,
            "most_lost_on": worst,
            "most_lost_share": round(worst_lost / total_lost, 2) if total_lost else 0.0,
            "moves": moves,
            "peak_sessions_per_worker": peak_sessions(turns),
        })  # fmt: skip
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("trace", help="a file routing_live.py --trace wrote")
    args = p.parse_args(argv)
    rows = [json.loads(line) for line in Path(args.trace).read_text().splitlines() if line]
    for s in summarize(rows):
        print(json.dumps(s))
    return 0


if __name__ == "__main__":
    sys.exit(main())
