"""Tables and plots of the routing grid (benchmarks/routing_grid.py's JSON output).

    .venv/bin/python benchmarks/routing_grid_report.py benchmarks/results/routing_grid_*.json
    # a variant grid (engines capping long prefills), its plots beside the default ones:
    .venv/bin/python benchmarks/routing_grid_report.py --suffix _lp4096 \
        --note "engines cap prefills at 4096 tokens a step" \
        benchmarks/results/routing_grid_{mooncake,synthetic}_lp4096_cap.json

Prints the markdown table docs/routing.md quotes and writes one PNG per regime (cache x
load) to docs/routing_<cache>_<load>.png: hit rate and TTFT p99 against N per workload.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
POLICIES = ("kv_aware", "dynamo", "sglang", "sglang_smg", "llmd", "round_robin")
ANCHORS = POLICIES[1:5]


def load(paths: list[str]) -> list[dict[str, Any]]:
    cells: list[dict[str, Any]] = []
    for p in paths:
        cells += json.loads(Path(p).read_text())
    return cells


def table(cells: list[dict[str, Any]]) -> str:
    head = "| workload | N | cache | load | shared bound |"
    head += "".join(f" {p} hit / p50 / p99 |" for p in POLICIES)
    head += " kv_aware imbalance (busy) | kv_aware behind (by how much) |"
    lines = [head, "|" + "---|" * (7 + len(POLICIES))]
    for c in cells:
        pol = c["policies"]
        k = pol["kv_aware"]
        lag = []
        for a in ANCHORS:
            m = pol[a]
            if m["hit_rate"] > k["hit_rate"]:
                lag.append(f"hit {100 * (k['hit_rate'] - m['hit_rate']):+.2f} pt vs {a}")
            if m["ttft_p99_s"] < k["ttft_p99_s"]:
                lag.append(f"p99 {100 * (k['ttft_p99_s'] / m['ttft_p99_s'] - 1):+.1f}% vs {a}")
        row = (
            f"| {c['workload']} | {c['workers']} | {c['cache']} | {c['load']:g} "
            f"| {c['bounds']['shared_cache']:.1%} |"
        )
        for p in POLICIES:
            m = pol[p]
            row += f" {m['hit_rate']:.1%} / {m['ttft_p50_s']:.2f} / {m['ttft_p99_s']:.2f} |"
        busy = f" ({k['busy_imbalance']:.2f})" if "busy_imbalance" in k else ""
        row += f" {k['imbalance']:.2f}{busy} |"
        row += " ahead |" if not lag else f" {', '.join(lag)} |"
        lines.append(row)
    return "\n".join(lines)


def losses(cells: list[dict[str, Any]]) -> str:
    """Hits lost to eviction, measured from the engines alike for every policy (charged
    engines only): a session's previous turn evicted before its next turn was routed (a
    share of the tokens the two share), and hits evicted while a request queued (a share
    of the hit tokens expected at routing). Empty for grids run before these were kept;
    "--" for a policy whose results a re-run reused from such a grid."""
    kept = [c for c in cells if "prev_turn_tokens_evicted" in c["policies"]["kv_aware"]]
    if not kept:
        return ""
    head = "| workload | N | cache | load |" + "".join(f" {p} |" for p in POLICIES)
    lines = [
        "previous turn evicted (% of shared tokens) / queue loss (% of expected hits)",
        "",
        head,
        "|" + "---|" * (4 + len(POLICIES)),
    ]
    for c in kept:
        row = f"| {c['workload']} | {c['workers']} | {c['cache']} | {c['load']:g} |"
        for p in POLICIES:
            m = c["policies"][p]
            if "prev_turn_tokens_evicted" not in m:  # reused from a grid recorded before
                row += " -- |"
                continue
            row += (
                f" {100 * m['prev_turn_tokens_evicted']:.1f} / "
                f"{100 * m['queue_hit_tokens_lost']:.2f} |"
            )
        lines.append(row)
    return "\n".join(lines)


def summary(cells: list[dict[str, Any]]) -> str:
    """Cells where kv_aware is at or ahead of every anchor on hit rate and TTFT p99 (and,
    counted apart, where its TTFT p50 is at or under every anchor's, and where its
    engines' busy time, not only its prompt tokens, is within 1.10 of even)."""
    ok = hit = p99 = p50 = balanced = busy = 0
    for c in cells:
        pol = c["policies"]
        k = pol["kv_aware"]
        h = all(k["hit_rate"] >= pol[a]["hit_rate"] for a in ANCHORS)
        q = all(k["ttft_p99_s"] <= pol[a]["ttft_p99_s"] for a in ANCHORS)
        ok += h and q
        hit += h
        p99 += q
        p50 += all(k["ttft_p50_s"] <= pol[a]["ttft_p50_s"] for a in ANCHORS)
        balanced += k["imbalance"] <= 1.10
        busy += k.get("busy_imbalance", float("inf")) <= 1.10
    n = len(cells)
    timed = all("busy_imbalance" in c["policies"]["kv_aware"] for c in cells)
    return (
        f"kv_aware at or ahead of every anchor on hit rate and TTFT p99: {ok}/{n} cells "
        f"(hit rate {hit}/{n}, TTFT p99 {p99}/{n}); token imbalance <= 1.10 in {balanced}/{n}; "
        f"TTFT p50 at or under every anchor's in {p50}/{n}"
        + (f"; engine busy-time imbalance <= 1.10 in {busy}/{n}" if timed else "")
    )


def plots(
    cells: list[dict[str, Any]], out_dir: Path, suffix: str = "", note: str = ""
) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    workloads = list(dict.fromkeys(c["workload"] for c in cells))
    for cache in ("tight", "generous"):
        for load_ in sorted({c["load"] for c in cells}):
            sel = [c for c in cells if c["cache"] == cache and c["load"] == load_]
            if not sel:
                continue
            fig, axes = plt.subplots(2, len(workloads), figsize=(4.2 * len(workloads), 6.5))
            axes = axes.reshape(2, len(workloads))
            for j, wl in enumerate(workloads):
                rows = sorted((c for c in sel if c["workload"] == wl), key=lambda c: c["workers"])
                ns = [c["workers"] for c in rows]
                for i, p in enumerate(POLICIES):
                    style = {"lw": 2.5, "color": "k"} if p == "kv_aware" else {"color": f"C{i}"}
                    axes[0, j].plot(ns, [100 * c["policies"][p]["hit_rate"] for c in rows],
                                    marker="o", label=p, **style)  # fmt: skip
                    axes[1, j].plot(ns, [c["policies"][p]["ttft_p99_s"] for c in rows],
                                    marker="o", label=p, **style)  # fmt: skip
                axes[0, j].set_title(wl)
                axes[0, j].set_ylabel("hit rate (%)")
                axes[1, j].set_ylabel("TTFT p99 (s)")
                axes[1, j].set_yscale("log")
                for ax in axes[:, j]:
                    ax.set_xscale("log", base=2)
                    ax.set_xticks(ns, [str(n) for n in ns])
                    ax.set_xlabel("workers")
            axes[0, 0].legend(fontsize=7)
            extra = f", {note}" if note else ""
            fig.suptitle(
                f"charged engine model{extra}, {cache} cache, load {load_:g} (held-out data)"
            )
            fig.tight_layout()
            path = out_dir / f"routing_{cache}_{load_:g}{suffix}.png"
            fig.savefig(path, dpi=90)
            plt.close(fig)
            written.append(path)
    return written


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("paths", nargs="+", help="routing_grid.py JSON files")
    ap.add_argument("--suffix", default="", help="appended to each plot's file name")
    ap.add_argument("--note", default="", help="added to each plot's title")
    a = ap.parse_args()
    cells = load(a.paths)
    print(table(cells))
    print()
    print(summary(cells))
    lost = losses(cells)
    if lost:
        print()
        print(lost)
    for p in plots(cells, ROOT / "docs", a.suffix, a.note):
        print(f"wrote {p.relative_to(ROOT)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
