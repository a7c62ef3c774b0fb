"""The routing grid: kv_aware vs the anchors, charged engine model, held-out splits.

    .venv/bin/python benchmarks/routing_grid.py --jobs 2 --out benchmarks/results/routing_grid.json
    .venv/bin/python benchmarks/routing_grid.py --split tune --quick   # while tuning
    .venv/bin/python benchmarks/routing_grid_report.py benchmarks/results/routing_grid.json

Cells: workload x N in {8, 16, 32} x cache {tight, generous} x load {0.5, 0.9}. Workloads:
the Mooncake conversation trace (tune on its first 30%, report on the last 60%, time
order) and two synthetic mixes (chat-only, agent+fan-out; tune on seed 1, report on seed
2). Every cell runs every policy over the same requests (``kvroute bench routing``'s
lock-step replay); ``routing_grid_report.py`` turns the JSON into docs/routing.md's table
and one plot per regime. Each cell is one process's work in simulated time, so ``--jobs``
runs cells side by side with the same results as one at a time.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from router.bench.commands import build_parser, run_bench  # noqa: E402

POLICIES = ("kv_aware", "dynamo", "sglang", "sglang_smg", "llmd", "round_robin")
ANCHORS = ("dynamo", "sglang", "sglang_smg", "llmd")
# name -> (bench arguments, tight blocks, generous blocks) per split
WORKLOADS: dict[str, dict[str, Any]] = {
    "mooncake": {
        "args": ["--block-size", "512"],
        "tune": ["--slice", "0:0.3"],
        "report": ["--slice", "0.4:1"],
        "cache": {"tight": 1024, "generous": 8192},
    },
    "chat": {
        "args": ["--synthetic", "1500", "--mix", "1,0,0", "--block-size", "64"],
        "tune": ["--seed", "1"],
        "report": ["--seed", "2"],
        "cache": {"tight": 256, "generous": 2048},
    },
    "agent_fanout": {
        "args": ["--synthetic", "1500", "--mix", "0,2,1", "--block-size", "64"],
        "tune": ["--seed", "1"],
        "report": ["--seed", "2"],
        "cache": {"tight": 256, "generous": 2048},
    },
}


def cell_argv(
    workload: str, n: int, cache: str, load: float, split: str, extra: Sequence[str] = ()
) -> list[str]:
    """``kvroute bench routing`` arguments of one grid cell (charged engines, one
    process), without policies: the grid, the tuner and the trace tools replay the same
    cells."""
    w = WORKLOADS[workload]
    argv = ["routing", *w["args"], *w[split], "--engine-model", "charged"]
    argv += ["--workers", str(n), "--gpu-blocks", str(w["cache"][cache])]
    argv += ["--load", str(load), "--jobs", "1", *extra]
    return argv


def cell(
    workload: str,
    n: int,
    cache: str,
    load: float,
    split: str,
    extra: list[str],
    policies: tuple[str, ...] = POLICIES,
) -> dict[str, Any]:
    argv = cell_argv(workload, n, cache, load, split, extra)
    for p in policies:
        argv += ["--policy", p]
    args = build_parser().parse_args(argv)
    result = run_bench(args)
    return {
        "workload": workload,
        "workers": n,
        "cache": cache,
        "load": load,
        "split": split,
        "argv": argv,
        "bounds": result["bounds"],
        "label": result["config"]["workload"],
        "policies": result["policies"],
        "wall_s": result["timings_s"]["wall_s"],
    }


def verdict(c: dict[str, Any]) -> dict[str, bool]:
    """kv_aware at or ahead of every anchor on hit rate and TTFT p99 (p50 too)."""
    k = c["policies"]["kv_aware"]
    a = [c["policies"][x] for x in ANCHORS]
    return {
        "hit": all(k["hit_rate"] >= m["hit_rate"] for m in a),
        "p99": all(k["ttft_p99_s"] <= m["ttft_p99_s"] for m in a),
        "p50": all(k["ttft_p50_s"] <= m["ttft_p50_s"] for m in a),
    }


Cell = tuple[str, int, str, float]


def run_cell(
    key: Cell,
    split: str,
    extra: list[str],
    policies: tuple[str, ...],
    old: dict[str, Any] | None,
) -> tuple[dict[str, Any], str]:
    """One grid cell (only ``policies`` rerun where ``old`` has the others) and its
    printed line."""
    t0 = time.perf_counter()
    wl, n, cache, load = key
    c = cell(wl, n, cache, load, split, extra, policies if old else POLICIES)
    if old:
        c["policies"] = {
            p: c["policies"][p] if p in policies else old["policies"][p] for p in POLICIES
        }
        c["reused_from_previous_run"] = [p for p in POLICIES if p not in policies]
    v = verdict(c)
    k = c["policies"]["kv_aware"]
    best = {x: c["policies"][x] for x in ANCHORS}
    line = (
        f"{wl:12s} N={n:2d} {cache:8s} load={load:.1f} kv_aware hit {k['hit_rate']:.4f} "
        f"p50 {k['ttft_p50_s']:.2f} p99 {k['ttft_p99_s']:.2f} imb {k['imbalance']:.2f} | "
        + " ".join(f"{x} {m['hit_rate']:.4f}/{m['ttft_p99_s']:.2f}" for x, m in best.items())
        + f" | {'OK' if all(v.values()) else v} ({time.perf_counter() - t0:.0f}s)"
    )
    return c, line


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--split", choices=("tune", "report"), default="report")
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--workers", default="8,16,32")
    ap.add_argument("--caches", default="tight,generous")
    ap.add_argument("--loads", default="0.5,0.9")
    ap.add_argument("--quick", action="store_true", help="N=8 only")
    ap.add_argument("--extra", default="", help="extra bench arguments, space separated")
    ap.add_argument("--out", default=None)
    ap.add_argument(
        "--reuse",
        default=None,
        help="a previous grid JSON: rerun only --policies, take the others' results from "
        "the same cell there (the policies are simulated independently; same seeds)",
    )
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--jobs", type=int, default=1, help="cells run side by side (processes)")
    args = ap.parse_args()
    reuse: dict[Cell, dict[str, Any]] = {}
    for path in (args.reuse or "").split(","):
        for old in json.loads(Path(path).read_text()) if path else []:
            if old["split"] == args.split:
                reuse[(old["workload"], old["workers"], old["cache"], old["load"])] = old
    policies = tuple(args.policies.split(","))
    workers = [8] if args.quick else [int(x) for x in args.workers.split(",")]
    keys: list[Cell] = list(
        itertools.product(
            args.workloads.split(","),
            workers,
            args.caches.split(","),
            [float(x) for x in args.loads.split(",")],
        )
    )
    extra = args.extra.split()
    done: dict[int, dict[str, Any]] = {}

    def record(i: int, c: dict[str, Any], line: str) -> None:
        done[i] = c
        print(line, flush=True)
        if args.out:  # the cells finished so far, in grid order
            cells = [done[j] for j in sorted(done)]
            Path(args.out).write_text(json.dumps(cells, indent=1) + "\n")

    if args.jobs <= 1:
        for i, key in enumerate(keys):
            record(i, *run_cell(key, args.split, extra, policies, reuse.get(key)))
        return 0
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        futures = {
            pool.submit(run_cell, key, args.split, extra, policies, reuse.get(key)): i
            for i, key in enumerate(keys)
        }
        for fut in futures:  # submission order: the printed lines stay in grid order
            record(futures[fut], *fut.result())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
