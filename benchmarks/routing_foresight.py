"""How much would knowing which sessions come back soon buy ``kv_aware``'s TTFT p99?

    .venv/bin/python benchmarks/routing_foresight.py --workers 8 --cache generous \\
        --load 0.5 --split report --horizon 12 --weight 100000 [--hazard] \\
        [--grid benchmarks/results/routing_grid_mooncake.json] [--min-miss TOKENS] \\
        [--extra "--profile prefill-shaping"]

Replays one Mooncake grid cell (charged engines, ``kv_aware`` only) and makes a long
uncached prompt (one the policy prices by TTFT) pay ``--weight`` tokens per session whose
last turn went to a worker and which returns within ``--horizon`` seconds: known from the
trace (foresight, which no router has), or with ``--hazard`` estimated from the session's
age and the trace's distribution of gaps between turns (what a router could learn). The
load-0.5 p99 gap to Dynamo is cached turns queued behind such prompts (docs/routing_rounds.md,
round 10); this says whether placing the long prompts could close it. With ``--grid``
(a grid JSON holding the cell's anchors) it ends with ``routing_trace.py``'s "p99 price"
line against them: what moving queued cached turns would still have to pay on top. A
scratch experiment: it patches the policy in this process only.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import itertools
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.routing_grid import ANCHORS, cell_argv  # noqa: E402
from benchmarks.routing_trace import _p99_price, record_decisions  # noqa: E402
from router.bench import commands  # noqa: E402
from router.bench.trace_replay import replay  # noqa: E402
from router.routing import policy  # noqa: E402
from router.routing.state import RoutingCore  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--cache", default="generous")
    ap.add_argument("--load", default="0.5")
    ap.add_argument("--split", default="tune", choices=("tune", "report"))
    ap.add_argument("--horizon", type=float, default=10.0, help="seconds")
    ap.add_argument("--weight", type=float, default=50_000.0, help="tokens per return")
    ap.add_argument("--hazard", action="store_true", help="estimate returns from age")
    ap.add_argument("--grid", default=None, help="grid JSON with this cell's anchors")
    ap.add_argument(
        "--min-miss",
        type=float,
        default=None,
        help="uncached tokens from which a prompt pays (default: the ttft_miss weight)",
    )
    ap.add_argument("--extra", default="", help="more bench routing flags, e.g. a profile")
    a = ap.parse_args()
    argv = cell_argv("mooncake", a.workers, a.cache, float(a.load), a.split)
    argv += ["--policy", "kv_aware", *a.extra.split()]
    args = commands.build_parser().parse_args(argv)
    cfg = commands._config(args)
    workload, _ = commands._workload(args)
    reqs = list(workload)
    index = {r.request_id: i for i, r in enumerate(reqs)}
    turns: dict[str, list[int]] = {}
    for i, r in enumerate(reqs):
        turns.setdefault(r.session_id, []).append(i)
    gaps = sorted(
        reqs[j].arrival - reqs[i].arrival for t in turns.values() for i, j in itertools.pairwise(t)
    )
    never = len(turns)  # every session's last turn has no next one

    def p_return(age: float) -> float:
        below = bisect.bisect_right(gaps, age)
        alive = len(gaps) - below + never
        return (bisect.bisect_right(gaps, age + a.horizon) - below) / alive

    last: dict[str, tuple[str, float]] = {}  # session -> (worker, time) of its last turn
    now: dict[str, Any] = {}
    costs = policy.KvAwarePolicy.costs
    rows = record_decisions(cfg.routing.weights)  # what _p99_price reads
    route = RoutingCore.route

    def hooked_route(self: RoutingCore, rid: str, *pa: Any, **kw: Any) -> Any:
        now.update(rid=rid, t=kw.get("now"))
        d = route(self, rid, *pa, **kw)
        last[reqs[index[rid]].session_id] = (d.worker_id, kw.get("now") or 0.0)
        return d

    def returns(t: float, me: int) -> dict[str, float]:
        out: dict[str, float] = {}
        for session, (worker, then) in last.items():
            if a.hazard:
                out[worker] = out.get(worker, 0.0) + p_return(t - then)
                continue
            nxt = [j for j in turns[session] if j > me and t <= reqs[j].arrival <= t + a.horizon]
            if nxt:
                out[worker] = out.get(worker, 0.0) + 1.0
        return out

    def hooked_costs(self: Any, request: Any, views: Any, loads: Any, weights: Any) -> list[float]:
        c = costs(self, request, views, loads, weights)
        best = max(max(v.score, float(v.predicted_tokens)) for v in views)
        if request.request_tokens - best < (
            weights.ttft_miss if a.min_miss is None else a.min_miss
        ):
            return c
        back = returns(now["t"], index[now["rid"]])
        return [x + a.weight * back.get(v.worker_id, 0.0) for x, v in zip(c, views, strict=True)]

    RoutingCore.route = hooked_route  # type: ignore[method-assign]
    policy.KvAwarePolicy.costs = hooked_costs  # type: ignore[method-assign]
    result = asyncio.run(replay(reqs, commands._fleet_specs(args, cfg), cfg, bounds=False))
    s = result["policies"]["kv_aware"]
    mode = "hazard" if a.hazard else "foresight"
    print(
        f"{mode} horizon {a.horizon:g}s weight {a.weight:g}: hit {s['hit_rate'] * 100:.2f}% "
        f"p99 {s['ttft_p99_s']:.2f}s p50 {s['ttft_p50_s']:.2f}s imbalance {s['imbalance']:.2f}"
    )
    if a.grid:
        key = (a.workers, a.cache, float(a.load), a.split)
        cells = [
            c
            for c in json.loads(Path(a.grid).read_text())
            if (c["workers"], c["cache"], c["load"], c["split"]) == key
        ]
        if not cells:
            print(f"no cell {key} in {a.grid}: no p99 price")
            return 1
        anchors = {p: cells[0]["policies"][p] for p in ANCHORS}
        _p99_price(rows, {"kv_aware": s, **anchors})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
