"""How much of a grid cell's verdict is tie-break noise: one grid re-run per seed.

    for s in 1 2; do .venv/bin/python benchmarks/routing_grid.py --workloads mooncake \
        --policies kv_aware,dynamo,sglang,sglang_smg,llmd \
        --reuse benchmarks/results/routing_grid_mooncake.json --extra "--seed $s" \
        --out benchmarks/results/routing_grid_mooncake_seed$s.json; done
    .venv/bin/python benchmarks/routing_grid_spread.py \
        benchmarks/results/routing_grid_mooncake.json \
        benchmarks/results/routing_grid_mooncake_seed1.json \
        benchmarks/results/routing_grid_mooncake_seed2.json

Or, since ``kv_aware`` does not tie (its costs are continuous) and so never moves with
that seed: every policy's engines 0.1% faster or slower (alternating, so the fleet's
capacity and the arrival scaling stay the same), which perturbs every policy's history:

    for sp in 1.001,0.999 0.999,1.001; do .venv/bin/python benchmarks/routing_grid.py \
        --workloads mooncake --policies kv_aware,dynamo,sglang,sglang_smg,llmd \
        --reuse benchmarks/results/routing_grid_mooncake.json --extra "--worker-speeds $sp" \
        --out benchmarks/results/routing_grid_mooncake_speeds_${sp/,/_}.json; done

The seed is the router's tie-break stream (and the trace's token contents, which do not
change what is shared). Anchors that score in whole blocks tie often, so their results
move with it; a single run's lead of a few tenths of a point may be one seed's luck.
Prints a markdown table: per cell, ``kv_aware`` and the best anchor (by the mean over
seeds) with their ranges, and whether ``kv_aware`` is ahead on the mean and in every seed.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from statistics import fmean
from typing import Any

ANCHORS = ("dynamo", "sglang", "sglang_smg", "llmd")
Key = tuple[str, int, str, float]


def load(path: str) -> dict[Key, dict[str, Any]]:
    cells = json.loads(Path(path).read_text())
    return {(c["workload"], c["workers"], c["cache"], c["load"]): c for c in cells}


def span(values: list[float], fmt: str) -> str:
    lo, hi = min(values), max(values)
    return format(lo, fmt) if lo == hi else f"{lo:{fmt}}-{hi:{fmt}}"


def verdict(runs: list[dict[Key, dict[str, Any]]], key: Key) -> tuple[str, bool, bool]:
    """One table row, and whether kv_aware is ahead on the mean / in every seed."""

    def metric(policy: str, name: str) -> list[float]:
        return [float(r[key]["policies"][policy][name]) for r in runs]

    hit, p99 = metric("kv_aware", "hit_rate"), metric("kv_aware", "ttft_p99_s")
    hits = {a: metric(a, "hit_rate") for a in ANCHORS}
    tails = {a: metric(a, "ttft_p99_s") for a in ANCHORS}
    best_hit = max(ANCHORS, key=lambda a: fmean(hits[a]))
    best_p99 = min(ANCHORS, key=lambda a: fmean(tails[a]))
    behind = []
    if fmean(hit) < fmean(hits[best_hit]) - 1e-9:
        behind.append(f"hit {100 * (fmean(hit) - fmean(hits[best_hit])):+.2f} pt vs {best_hit}")
    if fmean(p99) > fmean(tails[best_p99]) + 1e-9:
        behind.append(f"p99 {100 * (fmean(p99) / fmean(tails[best_p99]) - 1):+.1f}% vs {best_p99}")
    every = all(
        hit[i] >= max(hits[a][i] for a in ANCHORS) - 1e-9
        and p99[i] <= min(tails[a][i] for a in ANCHORS) + 1e-9
        for i in range(len(runs))
    )
    pct = [100 * x for x in hit]
    row = (
        f"| {key[0]} | {key[1]} | {key[2]} | {key[3]} | {span(pct, '.2f')}% | "
        f"{best_hit} {span([100 * x for x in hits[best_hit]], '.2f')}% | {span(p99, '.2f')} | "
        f"{best_p99} {span(tails[best_p99], '.2f')} | {', '.join(behind) or 'yes'} | "
        f"{'yes' if every else 'no'} |"
    )
    return row, not behind, every


def main(paths: list[str]) -> None:
    runs = [load(p) for p in paths]
    keys = [k for k in runs[0] if all(k in r for r in runs)]
    print(
        "| workload | N | cache | load | kv_aware hit | best anchor hit | kv_aware p99 s "
        "| best anchor p99 s | ahead on the mean | ahead in every seed |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    on_mean = every = 0
    for key in keys:
        row, mean_ok, every_ok = verdict(runs, key)
        print(row)
        on_mean += mean_ok
        every += every_ok
    print(
        f"\nkv_aware ahead on the mean of {len(runs)} seeds: {on_mean}/{len(keys)} cells; "
        f"in every seed: {every}/{len(keys)}"
    )


def parse_args(argv: list[str] | None = None) -> list[str]:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("grids", nargs="+", metavar="GRID_JSON", help="routing_grid.py --out files")
    return parser.parse_args(argv).grids


if __name__ == "__main__":
    main(parse_args())
