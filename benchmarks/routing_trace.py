"""Per-request traces of routing decisions in one grid cell: why a policy wins or loses.

    .venv/bin/python benchmarks/routing_trace.py --workload mooncake --workers 16 \
        --cache generous --load 0.5 [--split tune] [--policies kv_aware,llmd] \
        [--weights held=0.02] [--out trace.jsonl]

Replays the cell (``routing_grid.py``'s arguments, charged engines) in this process with a
hook on ``RoutingCore.route`` and prints, per policy: how often it sent a request away from
the worker with the most cached tokens ("moved"), the cached tokens that cost (per the
index, at routing time), the hit tokens lost between routing and admission (evicted while
queued: the estimate over the truth), what was cached anywhere when each request arrived
(availability: what the policy's earlier placements left, overall and for prompts of 64k+
tokens), and for ``kv_aware`` which cost term decided each
move (the term whose difference between the chosen and the best-cached worker was
largest). With ``kv_aware`` and another policy whose TTFT p99 is lower, a "p99 price"
line says what matching that p99 would cost ``kv_aware`` in hits (``_p99_price``).
``--out`` writes one JSON line per decision (with the chosen worker and every worker's
cached tokens, backlog, in-flight and recently routed tokens).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.routing_grid import WORKLOADS, cell_argv  # noqa: E402
from router.bench import commands  # noqa: E402
from router.bench.trace_replay import replay  # noqa: E402
from router.routing.base import (  # noqa: E402
    RouteInput,
    backlog_weight,
    cache_affinity,
    held_weight,
    prefill_weight,
    share_prior_tokens,
)
from router.routing.state import Decision, RoutingCore  # noqa: E402


def _terms(
    d: Decision, i: int, w: Any, routed: int, share_x: float, idle: float
) -> dict[str, float]:
    """kv_aware's cost of worker ``i`` split into its terms (policy.py's formula);
    ``share_x`` and ``idle``: the share term's weight and the fleet's idle share at that
    decision (``RoutingCore.share_weight``, ``RoutingCore.idle``)."""
    v = d.views[i]
    n = d.request_tokens
    aff = cache_affinity(v, d.hot_tokens, w.hot_discount)
    fair = sum(x.recent_tokens for x in d.views) / len(d.views)
    share = 0.0
    if w.share > 0 and fair > 0:
        prior = share_prior_tokens(RouteInput(n, routed=routed), len(d.views), w)
        share = w.share * share_x * n * (v.recent_tokens - fair) / (fair + prior)
    speed = v.speed if v.speed > 0 else 1.0
    backlog = backlog_weight(RouteInput(n, d.hot_tokens, idle=idle), d.views, w)
    return {
        "miss": prefill_weight(n, w) * (n - aff) / speed,
        "backlog": backlog * v.prefill_backlog / speed,
        "held": held_weight(n, w) * v.inflight_tokens + w.decode * v.inflight,
        "share": share,
    }


def record_decisions(weights: Any) -> list[dict[str, Any]]:
    """Hooks ``RoutingCore.route`` and ``first_token`` in this process: the returned list
    gets one row per decision (the chosen worker, every worker's cached tokens, backlog,
    in-flight and recent tokens; for ``kv_aware``'s moves the cost terms that differed),
    each with its TTFT once the first token is reported. ``weights``: kv_aware's."""
    rows: list[dict[str, Any]] = []
    original = RoutingCore.route

    def hooked(self: RoutingCore, *pa: Any, **kw: Any) -> Decision:
        d = original(self, *pa, **kw)
        hits = [v.hit_tokens for v in d.views]
        chosen = next(i for i, v in enumerate(d.views) if v.worker_id == d.worker_id)
        best = max(range(len(hits)), key=lambda i: (hits[i], i == chosen))
        row = {
            "policy": d.policy,
            "rid": d.request_id,
            "t": kw.get("now"),
            "n": d.request_tokens,
            "hit": hits[chosen],
            "best_hit": hits[best],
            "moved": hits[best] > hits[chosen],
            "backlog": round(d.views[chosen].prefill_backlog),
            "min_backlog": round(min(v.prefill_backlog for v in d.views)),
            "best_backlog": round(d.views[best].prefill_backlog),
            "worker": d.worker_id,
            "ids": [v.worker_id for v in d.views],
            "hits": hits,
            "backlogs": [round(v.prefill_backlog) for v in d.views],
            "inflight": [round(v.inflight_tokens) for v in d.views],
            "recent": [round(v.recent_tokens) for v in d.views],
        }
        if d.policy == "kv_aware" and row["moved"]:
            routed = self.routed_total - 1
            # The gates the policy used: routing changed nothing they read since.
            x = self.share_weight()
            tc = _terms(d, chosen, weights, routed, x, self.idle)
            tb = _terms(d, best, weights, routed, x, self.idle)
            row["diff"] = {k: round(tb[k] - tc[k], 1) for k in tc}
        rows.append(row)
        by_id[(id(self), d.request_id)] = row
        return d

    def first(self: RoutingCore, request_id: str, now: float | None = None) -> bool:
        row = by_id.get((id(self), request_id))
        if row is not None and now is not None:
            row["ttft"] = round(now - row["t"], 3)
        return first_token(self, request_id, now)

    by_id: dict[tuple[int, str], dict[str, Any]] = {}
    first_token = RoutingCore.first_token
    RoutingCore.route = hooked  # type: ignore[method-assign]
    RoutingCore.first_token = first  # type: ignore[method-assign]
    return rows


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workload", default="mooncake", choices=tuple(WORKLOADS))
    ap.add_argument("--workers", type=int, default=16)
    ap.add_argument("--cache", default="generous")
    ap.add_argument("--load", type=float, default=0.5)
    ap.add_argument("--split", default="tune", choices=("tune", "report"))
    ap.add_argument("--policies", default="kv_aware,llmd")
    ap.add_argument("--weights", default="")
    ap.add_argument("--out", default=None)
    ap.add_argument("--extra", default="", help="engine arguments, space separated")
    a = ap.parse_args()
    argv = cell_argv(a.workload, a.workers, a.cache, a.load, a.split, a.extra.split())
    if a.weights:
        argv += ["--weights", a.weights]
    for p in a.policies.split(","):
        argv += ["--policy", p]
    args = commands.build_parser().parse_args(argv)
    cfg = commands._config(args)
    weights = cfg.routing.weights
    rows = record_decisions(weights)
    workload, _ = commands._workload(args)
    fleets = commands._fleet_specs(args, cfg)
    result = asyncio.run(replay(workload, fleets, cfg, bounds=False))
    for p in a.policies.split(","):
        _summary(p, [r for r in rows if r["policy"] == p], result["policies"][p])
    _p99_price(rows, result["policies"])
    if a.out:
        Path(a.out).write_text("".join(json.dumps(r) + "\n" for r in rows))
    return 0


LONG_PROMPT = 65_536  # tokens: the prompts whose caches tight fleets lose first (round 20)


def _summary(p: str, mine: list[dict[str, Any]], summary: dict[str, Any]) -> None:
    """One policy's lines: hits as routed, moved and admitted; what was cached anywhere
    on arrival (availability: what placement left cached, before this decision), for all
    prompts and for the long ones; why kv_aware moved; its slowest 1%."""
    moved = [r for r in mine if r["moved"]]
    prompt = sum(r["n"] for r in mine)
    lost = sum(r["best_hit"] - r["hit"] for r in moved)
    est = sum(r["hit"] for r in mine)
    truth = summary["hit_rate"] * prompt
    why: Counter[str] = Counter()
    why_tokens: Counter[str] = Counter()
    for r in moved:
        if "diff" in r:
            k = max(r["diff"], key=lambda k: r["diff"][k] if k != "miss" else -1e18)
            why[k] += 1
            why_tokens[k] += r["best_hit"] - r["hit"]
    print(
        f"{p:10s} hit {summary['hit_rate']:.4f} p99 {summary['ttft_p99_s']:.2f} "
        f"imb {summary['imbalance']:.2f} | moved {len(moved)}/{len(mine)} "
        f"giving up {lost / prompt * 100:.2f}% of prompt tokens (index) | "
        f"estimated {est / prompt * 100:.2f}% vs admitted {truth / prompt * 100:.2f}% "
        f"(lost while queued {(est - truth) / prompt * 100:+.2f}%)"
    )
    long = [r for r in mine if r["n"] >= LONG_PROMPT]
    long_prompt = sum(r["n"] for r in long)
    print(
        f"   available on arrival (cached anywhere): "
        f"{sum(r['best_hit'] for r in mine) / prompt * 100:.2f}% of prompt tokens; "
        f"prompts of {LONG_PROMPT // 1024}k+ tokens: {len(long)}, "
        f"{long_prompt / prompt * 100:.1f}% of prompt tokens, "
        f"{sum(r['best_hit'] for r in long) / max(long_prompt, 1) * 100:.2f}% of theirs"
    )
    if why:
        print(
            "   moves decided by: "
            + ", ".join(f"{k} {why[k]} ({why_tokens[k] / prompt * 100:.2f}%)" for k in why)
        )
    slow = sorted(mine, key=lambda r: -r.get("ttft", 0.0))[: max(len(mine) // 100, 1)]
    print(
        "   slowest 1%: mean ttft {:.2f}s, prompt {:.0f}, cached {:.0f} (best {:.0f}), "
        "backlog {:.0f} (fleet min {:.0f}), moved {}".format(
            *(
                sum(r.get(k, 0) for r in slow) / len(slow)
                for k in ("ttft", "n", "hit", "best_hit", "backlog", "min_backlog")
            ),
            sum(r["moved"] for r in slow),
        )
    )


def _p99_price(rows: list[dict[str, Any]], summaries: dict[str, dict[str, Any]]) -> None:
    """What ``kv_aware`` would give up to match the lowest TTFT p99 in the run by moving
    cached turns off the queues they waited in: how many of its requests are above that
    p99 beyond the 1% allowed, how many of them are such turns (most of their prompt
    cached, queued behind a backlog another worker did not have), and the hits the
    cheapest that many hold -- against its hit lead over the best other policy. A lower
    bound on the price: it assumes the moved turns (and nothing else) change."""
    if "kv_aware" not in summaries or len(summaries) < 2:
        return
    others = {p: s for p, s in summaries.items() if p != "kv_aware"}
    fast = min(others, key=lambda p: others[p]["ttft_p99_s"])
    target = others[fast]["ttft_p99_s"]
    mine = [r for r in rows if r["policy"] == "kv_aware" and "ttft" in r]
    n = len(mine)
    allowed = n - 1 - int(0.99 * n)
    over = [r for r in mine if r["ttft"] > target]
    need = len(over) - allowed
    stuck = sorted(
        (r for r in over if r["hit"] >= r["n"] / 2 and r["backlog"] > r["min_backlog"]),
        key=lambda r: r["hit"],
    )
    prompt = sum(r["n"] for r in mine)
    cost = sum(r["hit"] for r in stuck[: max(need, 0)]) / prompt * 100
    best_hit = max(others, key=lambda p: others[p]["hit_rate"])
    lead = (summaries["kv_aware"]["hit_rate"] - others[best_hit]["hit_rate"]) * 100
    if need <= 0:
        print(f"p99 price: kv_aware at or under {fast}'s p99 ({target:.2f}s)")
        return
    print(
        f"p99 price: to reach {fast}'s p99 ({target:.2f}s) {need} of kv_aware's "
        f"{len(over)} requests above it must come under it; {len(stuck)} of those are "
        f"cached turns queued behind a backlog, the cheapest {min(need, len(stuck))} "
        f"hold {cost:.2f} pt of hits{'' if len(stuck) >= need else ' (not enough)'}; "
        f"kv_aware's hit lead over {best_hit}: {lead:+.2f} pt"
    )


if __name__ == "__main__":
    raise SystemExit(main())
