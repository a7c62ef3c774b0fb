"""Tables (rich) and charts (matplotlib, Agg: no display needed) for the demo."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def demo_table(summaries: Sequence[dict[str, Any]], args: argparse.Namespace) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(
        title=f"kvroute demo: {args.workers} engines ({args.groups}, "
        f"{args.gpu_blocks} GPU + {args.cpu_blocks} CPU blocks each)"
    )
    for col in ("policy", "requests", "hit rate", "prefill tokens saved", "imbalance",
                "estimate exact", "est. MAE (tok)", "TTFT* (ms)", "wall (s)"):  # fmt: skip
        if col == "policy":
            table.add_column(col, no_wrap=True, min_width=14)
        else:
            table.add_column(col, justify="right")
    for s in summaries:
        table.add_row(
            s["policy"],
            str(s["requests"]),
            f"{s['hit_rate']:.1%}",
            f"{s['prefill_tokens_saved']:,}",
            f"{s['imbalance']:.2f}",
            f"{s['estimate_exact']:.2%}",
            f"{s['estimate_mae_tokens']:.1f}",
            f"{1000 * s['ttft_mean_s']:.0f}",
            f"{s['wall_s']:.1f}",
        )
    console = Console(width=max(Console().width, 110))
    console.print(table)
    console.print(
        "hit rate = engine-reported cached_tokens / prompt tokens; imbalance = max/mean "
        "prompt tokens per engine; estimate exact = router hit_tokens == engine cached_tokens; "
        "TTFT* = mean queueing + prefill time in the demo's virtual cost model"
    )


def demo_chart(
    summaries: Sequence[dict[str, Any]], curves: Sequence[Sequence[float]], out: Path
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [s["policy"] for s in summaries]
    colors = [f"C{i}" for i in range(len(names))]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    ax = axes[0]
    bars = ax.bar(names, [100 * s["hit_rate"] for s in summaries], color=colors)
    ax.bar_label(bars, fmt="%.1f%%")
    ax.set_title("engine-measured prefix hit rate")
    ax.set_ylabel("% of prompt tokens")
    ax = axes[1]
    bars = ax.bar(names, [s["imbalance"] for s in summaries], color=colors)
    ax.bar_label(bars, fmt="%.2f")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_title("load imbalance (max/mean prompt tokens)")
    ax = axes[2]
    for name, curve, color in zip(names, curves, colors, strict=True):
        ax.plot(range(1, len(curve) + 1), [100 * v for v in curve], label=name, color=color)
    ax.set_title("cumulative hit rate")
    ax.set_xlabel("requests")
    ax.set_ylabel("%")
    ax.legend()
    for ax in axes[:2]:
        ax.tick_params(axis="x", labelrotation=20)
    exact = ", ".join(f"{s['policy']} {100 * s['estimate_exact']:.1f}%" for s in summaries)
    fig.suptitle(f"kvroute demo - router estimate == engine cached tokens: {exact}", fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
