"""One grid cell's hit-rate / TTFT-p99 trade-off: ``kv_aware`` over a sweep of weights,
against the anchors' points.

    .venv/bin/python benchmarks/routing_frontier.py --cell 32,tight,0.9 \
        --sweep backlog_large=0,0.005,0.01,0.02,0.04 --sweep held_large=0,0.02 \
        --out benchmarks/results/routing_frontier_n32_tight_09.json \
        --plot docs/routing_frontier_n32_tight_0.9.png

Where ``kv_aware`` trails an anchor on one figure and leads it on the other, the question
the issue asks is whether any setting of its weights is ahead on both -- and, with
``--anchor-sweep llmd:kv_weight=1,2,4`` (repeatable; the knobs of
``kvroute bench routing --policy-setting``), whether the anchor's own knobs trade one
figure for the other along the same curve. Every combination
of the ``--sweep`` values is run on the cell (the grid's arguments and seeds, Mooncake,
both splits by default), the anchors once per split; the plot puts each point on hit rate
against TTFT p99, so a setting ahead of an anchor on both lies up and to the left of it.
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

from benchmarks.routing_grid import ANCHORS  # noqa: E402
from benchmarks.routing_tune import run_cell  # noqa: E402


def settings(sweeps: list[str]) -> list[str]:
    """Every combination of ``name=v1,v2`` sweeps, as ``--weights`` strings."""
    axes = []
    for sweep in sweeps:
        name, _, values = sweep.partition("=")
        axes.append([f"{name}={v}" for v in values.split(",")])
    return [",".join(combo) for combo in itertools.product(*axes)]


def anchor_settings(sweeps: list[str]) -> dict[str, list[str]]:
    """``["llmd:kv_weight=1,2", "llmd:queue_weight=1,3"]`` -> every combination per
    anchor, as ``--policy-setting`` bodies (``{"llmd": ["kv_weight=1,queue_weight=1",
    ...]}``)."""
    per: dict[str, list[str]] = {}
    for sweep in sweeps:
        name, _, axis = sweep.partition(":")
        per.setdefault(name, []).append(axis)
    return {name: [s for s in settings(axes) if s] for name, axes in per.items()}


def _short(weights: str) -> str:
    """``backlog_large=0.01,held_large=0.02`` -> ``bl 0.01, hl 0.02`` (plot labels)."""
    if not weights:
        return "defaults"
    parts = []
    for item in weights.split(","):
        name, _, value = item.partition("=")
        parts.append("".join(w[0] for w in name.split("_")) + " " + value)
    return ", ".join(parts)


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    splits = list(result["splits"])
    fig, axes = plt.subplots(1, len(splits), figsize=(6 * len(splits), 4.8), squeeze=False)
    for ax, split in zip(axes[0], splits, strict=True):
        runs = result["splits"][split]
        kv = runs["kv_aware"]
        floor = min(m["hit_rate"] for m in kv.values()) - 0.01
        for name, m in kv.items():
            x, y = m["ttft_p99_s"], 100 * m["hit_rate"]
            ax.scatter(x, y, color="tab:green" if not name else "tab:blue", s=20)
            ax.annotate(_short(name), (x, y), fontsize=6, xytext=(3, 3), textcoords="offset points")
        left_out = []
        for a in ANCHORS:
            m = runs["anchors"][a]
            if m["hit_rate"] < floor:
                left_out.append(f"{a} {100 * m['hit_rate']:.1f}% / {m['ttft_p99_s']:.1f} s")
                continue
            x, y = m["ttft_p99_s"], 100 * m["hit_rate"]
            ax.scatter(x, y, marker="s", color="tab:red", s=36)
            ax.annotate(a, (x, y), fontsize=8, xytext=(3, -9), textcoords="offset points")
        for a, points in runs.get("anchor_settings", {}).items():
            for setting, m in points.items():
                x, y = m["ttft_p99_s"], 100 * m["hit_rate"]
                ax.scatter(x, y, marker="s", facecolors="none", edgecolors="tab:red", s=30)
                label = f"{a} {_short(setting)}"
                ax.annotate(label, (x, y), fontsize=6, xytext=(3, -8), textcoords="offset points")
        ax.set_xlabel("TTFT p99 (s)")
        ax.set_ylabel("hit rate (%)")
        title = f"{result['cell']}, {split} split"
        if left_out:
            title += "\nbelow the plot: " + "; ".join(left_out)
        ax.set_title(title, fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def ahead(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether point ``a`` is at or ahead of ``b`` on both hit rate and TTFT p99."""
    return bool(a["hit_rate"] >= b["hit_rate"] and a["ttft_p99_s"] <= b["ttft_p99_s"])


def verdicts(result: dict[str, Any]) -> list[str]:
    """Per split, per anchor point (its defaults and every swept setting): how many
    ``kv_aware`` settings are at or ahead of it on both figures, and whether it is ahead
    of ``kv_aware``'s defaults on both -- the anchor's own trade-off against ours."""
    lines = []
    for split, runs in result["splits"].items():
        kv = runs["kv_aware"]
        points = {a: runs["anchors"][a] for a in ANCHORS if a in runs["anchors"]}
        for a, swept in runs.get("anchor_settings", {}).items():
            points.update({f"{a} {_short(v)}": m for v, m in swept.items()})
        for name, m in points.items():
            beaten = [_short(v) for v, k in kv.items() if ahead(k, m)]
            over = ahead(m, kv[""]) and not ahead(kv[""], m)
            lines.append(
                f"{split:6s} {name:28s} {100 * m['hit_rate']:6.2f}% {m['ttft_p99_s']:6.2f} s | "
                f"kv_aware settings ahead on both: {len(beaten)}/{len(kv)}"
                + (" | ahead of kv_aware's defaults on both" if over else "")
            )
    return lines


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cell", default="32,tight,0.9", help="N,cache,load")
    ap.add_argument("--sweep", action="append", default=[], help="name=v1,v2,...")
    ap.add_argument(
        "--anchor-sweep", action="append", default=[], help="POLICY:name=v1,v2,... (repeatable)"
    )
    ap.add_argument("--splits", default="tune,report")
    ap.add_argument(
        "--extra",
        default="",
        help="engine arguments for every fleet, e.g. '--long-prefill-threshold 4096'",
    )
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--out", default=None)
    ap.add_argument("--plot", default=None)
    ap.add_argument("--replot", default=None, help="a previous --out JSON: plot it, run nothing")
    args = ap.parse_args()
    if args.replot:
        replayed = json.loads(Path(args.replot).read_text())
        print("\n".join(verdicts(replayed)))
        plot(replayed, Path(args.plot or "frontier.png"))
        return 0
    n, cache, load = args.cell.split(",")
    cell = ("mooncake", int(n), cache, float(load))
    variants = ["", *(v for v in settings(args.sweep) if v)]  # "" is the defaults
    splits = args.splits.split(",")
    tuned = anchor_settings(args.anchor_sweep)
    extra = args.extra.split()
    with ProcessPoolExecutor(args.jobs) as pool:
        anchors = {s: pool.submit(run_cell, cell, ANCHORS, "", extra, s) for s in splits}
        runs = {
            (s, v): pool.submit(run_cell, cell, ("kv_aware",), v, extra, s)
            for s in splits
            for v in variants
        }
        anchor_runs = {
            (s, a, v): pool.submit(
                run_cell, cell, (a,), "", [*extra, "--policy-setting", f"{a}:{v}"], s
            )
            for s in splits
            for a, values in tuned.items()
            for v in values
        }
        label = f"mooncake N={n} {cache} load {load}" + (f" ({args.extra})" if extra else "")
        result: dict[str, Any] = {"cell": label, "splits": {}}
        for s in splits:
            kv = {v: runs[(s, v)].result()["kv_aware"] for v in variants}
            result["splits"][s] = {"anchors": anchors[s].result(), "kv_aware": kv}
            swept = {
                a: {v: anchor_runs[(s, a, v)].result()[a] for v in values}
                for a, values in tuned.items()
            }
            if swept:
                result["splits"][s]["anchor_settings"] = swept
            points = {**kv, **result["splits"][s]["anchors"]}
            points.update({f"{a} {v}": m for a, ms in swept.items() for v, m in ms.items()})
            for name, m in points.items():
                label = name or "defaults"
                print(f"{s:6s} {label:40s} hit {m['hit_rate']:.4f} p99 {m['ttft_p99_s']:.3f}")
    print("\n".join(verdicts(result)))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    if args.plot:
        plot(result, Path(args.plot))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
