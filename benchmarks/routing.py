"""Routing benchmark: policies vs cache bounds on the Mooncake trace, as a markdown table.

    .venv/bin/python benchmarks/routing.py        # full trace, 8 workers: ~30 s on 2 cores
    .venv/bin/python benchmarks/routing.py --hma --limit 4000
    .venv/bin/python benchmarks/routing.py --hma --synthetic 600 --block-size 16 \
        --groups 'full:{bs},swa:{bs}:256' --workers 4 --gpu-blocks 1024
    .venv/bin/python benchmarks/routing.py --out benchmarks/results/routing.md

A thin wrapper over ``kvroute bench routing`` / ``kvroute bench hma`` (router.bench): the
same replay, printed as the table the README's routing section quotes. Extra arguments are
passed through (``--workers``, ``--gpu-blocks``, ``--weights``, ``--seed``, ...).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from router.bench.commands import build_parser, run_bench  # noqa: E402

TRACE = ROOT / "benchmarks/data/mooncake_conversation_trace.jsonl"


def routing_table(result: dict[str, Any]) -> str:
    bounds = result["bounds"]
    shared = bounds["shared_cache"] or 1.0
    cfg = result["config"]
    lines = [
        f"Workload: {cfg['workload']}; {cfg['workers']} workers x {cfg['gpu_blocks']} GPU "
        f"blocks of {cfg['groups'][0]['block_size']} tokens; bounds: shared cache (one LRU "
        f"of {cfg['workers'] * cfg['gpu_blocks']} blocks) {bounds['shared_cache']:.2%}, "
        f"infinite cache {bounds['infinite_cache']:.2%}.",
        "",
        "| policy | hit rate | % of shared-cache bound | imbalance | estimate exact "
        "| TTFT mean (s) | TTFT p99 (s) |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, m in result["policies"].items():
        lines.append(
            f"| {name} | {m['hit_rate']:.2%} | {m['hit_rate'] / shared:.1%} "
            f"| {m['imbalance']:.3f} | {m['estimate_exact']:.2%} "
            f"| {m['ttft_mean_s']:.3f} | {m['ttft_p99_s']:.3f} |"
        )
    lines.append("")
    lines.append(f"Replay wall time: {result['timings_s']['wall_s']:.1f} s ({cfg['jobs']} jobs).")
    return "\n".join(lines)


def hma_table(result: dict[str, Any]) -> str:
    cfg = result["config"]
    groups = ", ".join(
        f"{g['kind']}/{g['block_size']}"
        + (f"/W={g['sliding_window']}" if g["sliding_window"] else "")
        for g in cfg["groups"]
    )
    lines = [
        f"Workload: {cfg['workload']}; {cfg['workers']} workers x {cfg['gpu_blocks']} blocks; "
        f"groups {groups}; policy kv_aware fed by each scoring variant.",
        "",
        "| scoring | hit rate | estimate exact (chosen) | MAE (chosen, tok) "
        "| over / under | exact (all workers) | MAE (all workers, tok) |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, m in result["policies"].items():
        lines.append(
            f"| {name} | {m['hit_rate']:.2%} | {m['estimate_exact']:.2%} "
            f"| {m['estimate_mae_tokens']:.1f} | {m['estimate_over']} / {m['estimate_under']} "
            f"| {m['estimate_exact_all_workers']:.2%} | {m['estimate_mae_all_workers']:.1f} |"
        )
    lines.append("")
    lines.append(f"Replay wall time: {result['timings_s']['wall_s']:.1f} s ({cfg['jobs']} jobs).")
    return "\n".join(lines)


def main() -> int:
    outer = argparse.ArgumentParser(description=__doc__, add_help=True)
    outer.add_argument("--hma", action="store_true", help="the HMA scoring comparison")
    outer.add_argument("--out", default=None, help="also write the markdown here")
    ours, rest = outer.parse_known_args()
    bench = "hma" if ours.hma else "routing"
    source = [] if "--synthetic" in rest else ["--trace", str(TRACE)]
    args = build_parser().parse_args([bench, *source, *rest])
    result = run_bench(args, show_progress=sys.stderr.isatty())
    text = hma_table(result) if ours.hma else routing_table(result)
    print(text)
    if ours.out:
        Path(ours.out).parent.mkdir(parents=True, exist_ok=True)
        Path(ours.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
