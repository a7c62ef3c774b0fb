"""Tune ``kv_aware`` on the grid's *tuning* split: anchors once, weight variants many times.

    .venv/bin/python benchmarks/routing_tune.py --variants 'base:' 'b05:backlog=0.5' \
        [--workers 8,32] [--jobs 2] [--anchors benchmarks/results/routing_tune_anchors.json]
        [--extra '--long-prefill-threshold 4096' --anchors ANOTHER.json]

The anchors do not depend on ``kv_aware``'s weights (every fleet is simulated on its own),
so their results per tuning cell are computed once and cached in ``--anchors``; each
variant then replays ``kv_aware`` alone. Per variant it prints how many cells it is at or
ahead of every anchor on hit rate and TTFT p99, its worst hit-rate gap and p99 ratio
against the best anchor, its worst token imbalance, and (after "|") how many cells its
TTFT p50 is at or under every anchor's, and its worst p50 ratio. Never run on the report split:
the figures in docs/routing.md come from ``routing_grid.py --split report``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.routing_grid import ANCHORS, WORKLOADS, cell_argv  # noqa: E402
from router.bench.commands import build_parser, run_bench  # noqa: E402

Key = tuple[str, int, str, float]


def run_cell(
    key: Key, policies: tuple[str, ...], weights: str, extra: list[str], split: str = "tune"
) -> dict[str, Any]:
    """Per-policy results of one grid cell (``--weights`` for ``kv_aware`` if given)."""
    workload, n, cache, load = key
    argv = cell_argv(workload, n, cache, load, split, extra)
    if weights:
        argv += ["--weights", weights]
    for p in policies:
        argv += ["--policy", p]
    return run_bench(build_parser().parse_args(argv))["policies"]


def _name(key: Key) -> str:
    return "|".join(str(x) for x in key)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--variants", nargs="+", required=True, help="name:weights")
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--workers", default="8,32")
    ap.add_argument("--caches", default="tight,generous")
    ap.add_argument("--loads", default="0.5,0.9")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--anchors", default=str(ROOT / "benchmarks/results/routing_tune_anchors.json"))
    ap.add_argument("--verbose", action="store_true")
    ap.add_argument(
        "--extra",
        default="",
        help="engine arguments for every fleet, e.g. '--long-prefill-threshold 4096' "
        "(give the anchors their own --anchors file)",
    )
    args = ap.parse_args()
    keys: list[Key] = list(
        itertools.product(
            args.workloads.split(","),
            [int(x) for x in args.workers.split(",")],
            args.caches.split(","),
            [float(x) for x in args.loads.split(",")],
        )
    )
    cache_path = Path(args.anchors)
    anchors: dict[str, Any] = json.loads(cache_path.read_text()) if cache_path.exists() else {}
    missing = [k for k in keys if _name(k) not in anchors]
    variants = [v.partition(":")[::2] for v in args.variants]
    extra = args.extra.split()
    with ProcessPoolExecutor(args.jobs) as pool:
        futs = {_name(k): pool.submit(run_cell, k, ANCHORS, "", extra) for k in missing}
        runs = {
            (name, _name(k)): pool.submit(run_cell, k, ("kv_aware",), weights, extra)
            for name, weights in variants
            for k in keys
        }
        for name, fut in futs.items():
            anchors[name] = fut.result()
            cache_path.write_text(json.dumps(anchors, indent=1, sort_keys=True) + "\n")
        for name, _ in variants:
            won = hit_ok = p99_ok = p50_ok = 0
            worst_gap, worst_ratio, worst_p50, worst_imb = 0.0, 0.0, 0.0, 0.0
            for k in keys:
                kv = runs[(name, _name(k))].result()["kv_aware"]
                best_hit = max(anchors[_name(k)][a]["hit_rate"] for a in ANCHORS)
                best_p99 = min(anchors[_name(k)][a]["ttft_p99_s"] for a in ANCHORS)
                best_p50 = min(anchors[_name(k)][a]["ttft_p50_s"] for a in ANCHORS)
                h = kv["hit_rate"] >= best_hit
                p = kv["ttft_p99_s"] <= best_p99
                won += h and p
                hit_ok += h
                p99_ok += p
                p50_ok += kv["ttft_p50_s"] <= best_p50
                worst_p50 = max(worst_p50, kv["ttft_p50_s"] / max(best_p50, 1e-9))
                worst_gap = min(worst_gap, kv["hit_rate"] - best_hit)
                worst_ratio = max(worst_ratio, kv["ttft_p99_s"] / max(best_p99, 1e-9))
                worst_imb = max(worst_imb, kv["imbalance"])
                if args.verbose:
                    print(
                        f"  {name} {_name(k):28s} hit {kv['hit_rate']:.4f} (best {best_hit:.4f})"
                        f" p50 {kv['ttft_p50_s']:.2f} (best {best_p50:.2f})"
                        f" p99 {kv['ttft_p99_s']:.3f} (best {best_p99:.3f})"
                        f" imb {kv['imbalance']:.2f} {'OK' if h and p else ''}",
                        flush=True,
                    )
            print(
                f"{name:10s} won {won}/{len(keys)} hit {hit_ok} p99 {p99_ok} "
                f"worst hit gap {worst_gap * 100:+.2f}pt worst p99 x{worst_ratio:.2f} "
                f"max imbalance {worst_imb:.2f} | p50 {p50_ok} worst p50 x{worst_p50:.2f}",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
