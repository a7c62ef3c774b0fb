"""``kvroute bench routing`` and ``kvroute bench hma``: argument parsing and output."""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import queue
import sys
import time
from collections.abc import Iterable, Sequence, Sized
from pathlib import Path
from typing import Any

from offload_core.groups import parse_groups
from router.bench.charged import ChargedModel
from router.bench.sim import CostModel
from router.bench.trace_replay import (
    FleetSpec,
    ReplayConfig,
    every_group_as_full,
    full_groups_only,
    replay,
)
from router.bench.usage import usage_problem
from router.bench.workload_prep import (
    DEFAULT_TRACE,
    load_workload,
    mix_arg,
    non_negative_float,
    non_negative_int,
    parse_floats,
    parse_slice,
    positive_float,
    positive_int,
)
from router.bench.workloads import Request
from router.routing.policy import (
    COMPARED_POLICIES,
    POLICY_NAMES,
    parse_policy_settings,
    policy_weights,
)
from router.routing.profiles import DEFAULT_PROFILE, PROFILE_NAMES, profile_weights
from router.routing.state import RoutingConfig
from schemas.hashing import HASH_ALGOS
from schemas.hit_rule import hit_step

# 8 workers x 1024 blocks of 512 tokens: the shared bound sits well below the infinite
# one (the cache matters) and no single prompt exceeds a worker's pool.
DEFAULT_GPU_BLOCKS = 1024
_COST = CostModel()
DEFAULT_POLICIES = COMPARED_POLICIES


def _weights(text: str | None) -> dict[str, str]:
    """``prefill=1,decode=128`` -> ``{name: value}``, checked (unknown names, values that
    are not numbers are an error); applied on top of ``--profile``."""
    values: dict[str, str] = {}
    for item in (text or "").split(","):
        if not item.strip():
            continue
        name, sep, value = item.partition("=")
        if not sep:
            raise argparse.ArgumentTypeError(f"bad weight {item!r}: expected NAME=VALUE")
        if name.strip() in values:  # the last one won, silently
            raise argparse.ArgumentTypeError(f"weight {name.strip()!r} given twice")
        values[name.strip()] = value
    try:
        policy_weights(values)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return values


def _common(p: argparse.ArgumentParser, groups: str) -> None:
    p.add_argument("--trace", default=None, help=f"Mooncake JSONL (e.g. {DEFAULT_TRACE})")
    p.add_argument("--synthetic", type=positive_int, default=None, metavar="N",
                   help="use N synthetic requests instead of a trace")  # fmt: skip
    p.add_argument("--limit", type=positive_int, default=None, help="first K trace lines only")
    p.add_argument("--time-scale", type=positive_float, default=None,
                   help="speed arrivals up by this (default 1)")  # fmt: skip
    p.add_argument("--workers", type=positive_int, default=8,
                   help="simulated engines in the fleet")  # fmt: skip
    p.add_argument("--gpu-blocks", type=positive_int, default=DEFAULT_GPU_BLOCKS,
                   help="GPU blocks each")  # fmt: skip
    p.add_argument("--block-size", type=positive_int, default=512,
                   help="engine block size (512: one Mooncake hash id = one block)")  # fmt: skip
    p.add_argument("--groups", default=groups,
                   help="KV cache groups; {bs} stands for --block-size")  # fmt: skip
    p.add_argument("--hash", dest="hash_algo", choices=HASH_ALGOS, default="sha256",
                   help="block hash algorithm")  # fmt: skip
    p.add_argument("--profile", choices=PROFILE_NAMES, default=DEFAULT_PROFILE,
                   help="kv_aware route profile: the measured weight set for a kind "
                   "of fleet (docs/routing.md, Route profiles)")  # fmt: skip
    p.add_argument("--weights", type=_weights, default=None,
                   help="kv_aware weights on top of --profile, e.g. "
                   "decode=128,balance_slack=0.2")  # fmt: skip
    p.add_argument("--prefill-tps", type=positive_float, default=_COST.prefill_tps,
                   help="simulated prefill throughput, tokens/s")  # fmt: skip
    p.add_argument("--decode-s-per-token", type=non_negative_float,
                   default=_COST.decode_s_per_token,
                   help="simulated decode time per output token, s")  # fmt: skip
    p.add_argument("--event-delay", type=non_negative_float, default=0.0,
                   help="seconds between an engine's change and the router seeing it")  # fmt: skip
    p.add_argument("--hold-blocks", action=argparse.BooleanOptionalAction, default=None,
                   help="requests keep their blocks until they finish "
                   "(default: on for hma, off for routing)")  # fmt: skip
    p.add_argument("--engine-model", choices=("simple", "charged"), default="simple",
                   help="simple: one prefill at a time, free decode (the original figures); "
                   "charged: continuous batching, held blocks, learned speeds "
                   "(docs/routing.md)")  # fmt: skip
    p.add_argument("--long-prefill-threshold", type=non_negative_int, default=0,
                   help="charged engines: vLLM's --long-prefill-token-threshold "
                   "(0: off, vLLM's default)")  # fmt: skip
    p.add_argument("--worker-speeds", type=parse_floats, default=(),
                   help="per-worker speed factors, cycled (charged), e.g. 1,1,0.5")  # fmt: skip
    p.add_argument("--load", type=positive_float, default=None,
                   help="rescale arrivals to this offered load (see docs)")  # fmt: skip
    p.add_argument("--slice", type=parse_slice, default=None,
                   help="a:b: replay this fraction of the requests only")  # fmt: skip
    p.add_argument("--mix", type=mix_arg, default=None,
                   help="synthetic chat,agent,fanout session weights, e.g. 1,0,0")  # fmt: skip
    p.add_argument("--seed", type=int, default=0, help="random seed")
    p.add_argument("--jobs", type=positive_int, default=min(2, os.cpu_count() or 1),
                   help="processes to spread the fleets over")  # fmt: skip
    p.add_argument("--json", action="store_true", help="print JSON only")
    p.add_argument("--out", default=None, help="also write the JSON result to this file")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kvroute bench", description="routing benchmarks")
    sub = parser.add_subparsers(dest="bench", required=True)
    r = sub.add_parser("routing", help="policies vs bounds on a trace, in simulated time")
    _common(r, "full:{bs}")
    r.add_argument("--policy", action="append", choices=POLICY_NAMES, default=None,
                   help="repeatable; default: every policy")  # fmt: skip
    r.add_argument("--policy-setting", action="append", default=[], metavar="POLICY:K=V,...",
                   help="an anchor's knobs as deployed, repeatable, e.g. "
                   "llmd:kv_weight=1,queue_weight=3 (docs/routing.md)")  # fmt: skip
    h = sub.add_parser("hma", help="HMA-exact scoring vs full-only / all-full on a hybrid model")
    _common(h, "full:{bs},swa:{bs}:2048")
    h.add_argument("--policy", choices=POLICY_NAMES, default="kv_aware", help="routing policy")
    return parser


def _workload(args: argparse.Namespace) -> tuple[Iterable[Request], str]:
    workload, label, _ = load_workload(args)
    return workload, label


def _config(args: argparse.Namespace) -> ReplayConfig:
    groups = parse_groups(args.groups.replace("{bs}", str(args.block_size)))
    charged = args.engine_model == "charged"
    routing = RoutingConfig(
        weights=profile_weights(args.profile, args.weights),
        profile=args.profile,
        policy_settings=parse_policy_settings(getattr(args, "policy_setting", [])),
        prefix_block_tokens=hit_step(groups),
        seed=args.seed,
        # Charged engines report first tokens: the backlog leaves then, not by a given rate.
        prefill_tps=0.0 if charged else args.prefill_tps,
    )
    return ReplayConfig(
        workers=args.workers,
        gpu_blocks=args.gpu_blocks,
        groups=groups,
        routing=routing,
        cost=CostModel(args.prefill_tps, args.decode_s_per_token),
        engine_model=args.engine_model,
        charged=ChargedModel(long_prefill_token_threshold=args.long_prefill_threshold),
        worker_speeds=tuple(args.worker_speeds),
        hash_algo=args.hash_algo,
        event_delay_s=args.event_delay,
        truth_all_workers=args.bench == "hma",
        hold_blocks=args.bench == "hma" if args.hold_blocks is None else args.hold_blocks,
    )


def _fleet_specs(args: argparse.Namespace, cfg: ReplayConfig) -> list[FleetSpec]:
    if args.bench == "routing":
        names = args.policy or list(DEFAULT_POLICIES)
        return [FleetSpec(p, p) for p in dict.fromkeys(names)]
    return [
        FleetSpec("hma_exact", args.policy),
        FleetSpec("full_only", args.policy, full_groups_only(cfg.groups)),
        FleetSpec("all_full", args.policy, every_group_as_full),
    ]


def _job(
    args: argparse.Namespace, names: list[str], bounds: bool, done: Any, out: Any, idx: int
) -> None:
    """One process's share of the fleets (it re-reads and re-hashes the workload)."""
    try:
        cfg = _config(args)
        fleets = [f for f in _fleet_specs(args, cfg) if f.name in names]
        workload, _ = _workload(args)

        def progress(n: int) -> None:
            if n % 64 == 0:
                done.value = n

        result = asyncio.run(replay(workload, fleets, cfg, progress, bounds=bounds))
        out.put((idx, result, None))
    except BaseException as exc:  # reported by the parent
        out.put((idx, None, f"{type(exc).__name__}: {exc}"))


def run_bench(args: argparse.Namespace, show_progress: bool = False) -> dict[str, Any]:
    """Run the benchmark, splitting the fleets over ``args.jobs`` processes."""
    cfg = _config(args)
    names = [f.name for f in _fleet_specs(args, cfg)]
    workload, label = _workload(args)
    total = len(workload) if isinstance(workload, Sized) else None
    jobs = max(1, min(args.jobs, len(names)))
    shares = [names[i::jobs] for i in range(jobs)]
    fork = "fork" in mp.get_all_start_methods()
    ctx = mp.get_context("fork") if fork else mp.get_context("spawn")
    out = ctx.Queue()
    counters = [ctx.Value("l", 0) for _ in shares]
    # The bounds ride with the job holding the fewest fleets.
    bounds_job = min(range(jobs), key=lambda i: len(shares[i]))
    t0 = time.perf_counter()
    procs = [
        ctx.Process(target=_job, args=(args, share, i == bounds_job, counters[i], out, i))
        for i, share in enumerate(shares)
    ]
    for proc in procs:
        proc.start()
    results: dict[int, dict[str, Any]] = {}
    bar = _progress_bar(label, total) if show_progress else None
    try:
        while len(results) < jobs:
            try:
                idx, result, error = out.get(timeout=0.2)
            except queue.Empty:
                if bar is not None:
                    bar[0].update(bar[1], completed=min(c.value for c in counters))
                if any(p.exitcode not in (None, 0) for p in procs):
                    raise RuntimeError("a benchmark process died") from None
                continue
            if error is not None:
                raise RuntimeError(f"benchmark job failed: {error}")
            results[idx] = result
    finally:
        if bar is not None:
            bar[0].stop()
        for proc in procs:
            proc.join(timeout=5)
    merged = results[bounds_job]
    merged["policies"] = {
        name: results[i]["policies"][name] for i, share in enumerate(shares) for name in share
    }
    merged["policies"] = {n: merged["policies"][n] for n in names}
    merged["config"]["workload"] = label
    merged["config"]["jobs"] = jobs
    merged["timings_s"] = {
        "wall_s": round(time.perf_counter() - t0, 3),
        "per_job": [results[i]["timings_s"] for i in range(jobs)],
    }
    return merged


def _progress_bar(label: str, total: int | None) -> tuple[Any, Any]:
    from rich.progress import Progress

    bar = Progress(transient=True)
    bar.start()
    return bar, bar.add_task(f"replaying {label}", total=total)


def _print_table(result: dict[str, Any], title: str) -> None:
    from rich.console import Console
    from rich.table import Table

    bounds = result["bounds"]
    shared = bounds["shared_cache"] or 1.0
    table = Table(title=title)
    # Charged engines also report how unevenly they were busy (engine-seconds), which
    # unlike prompt tokens does not count cached tokens as load.
    busy = all("busy_imbalance" in m for m in result["policies"].values())
    imbalance = "imbalance (tokens / busy)" if busy else "imbalance"
    for col in ("fleet", "hit rate", "% of shared bound", imbalance, "estimate exact",
                "est. MAE (tok)", "TTFT mean (s)", "TTFT p99 (s)"):  # fmt: skip
        table.add_column(col, justify="left" if col == "fleet" else "right")
    for name, m in result["policies"].items():
        table.add_row(
            name,
            f"{m['hit_rate']:.2%}",
            f"{m['hit_rate'] / shared:.1%}",
            f"{m['imbalance']:.3f} / {m['busy_imbalance']:.3f}"
            if busy
            else f"{m['imbalance']:.3f}",
            f"{m['estimate_exact']:.2%}",
            f"{m['estimate_mae_tokens']:.1f}",
            f"{m['ttft_mean_s']:.3f}",
            f"{m['ttft_p99_s']:.3f}",
        )
    console = Console()
    console.print(table)
    console.print(
        f"bounds: infinite cache {bounds['infinite_cache']:.2%}, "
        f"shared cache (one LRU of {result['config']['workers']}x"
        f"{result['config']['gpu_blocks']} blocks) {bounds['shared_cache']:.2%}; "
        f"{result['config']['requests']} requests in {result['timings_s']['wall_s']:.1f}s"
    )


def engine_mismatch(args: argparse.Namespace) -> str | None:
    """What the simulated engines and ``kv_aware``'s ``prefill_cap`` disagree on, if
    anything: the weights were measured for engines that cap long prefills at that many
    tokens (``capped-prefill``), and on engines that do not -- or cap at another size --
    the comparison with the anchors is of a setting no fleet runs."""
    if args.bench != "routing":
        return None
    cap = int(profile_weights(args.profile, args.weights).prefill_cap)
    engines = args.long_prefill_threshold if args.engine_model == "charged" else 0
    if cap == engines:
        return None
    if engines == 0:
        return (
            f"kv_aware's prefill_cap is {cap} (engines that cap long prefills), but these "
            f"engines do not: add --engine-model charged --long-prefill-threshold {cap}"
        )
    if cap == 0:
        return (
            f"these engines cap long prefills at {engines} tokens a step: the setting "
            f"measured for them is --profile capped-prefill --weights prefill_cap={engines}"
        )
    return (
        f"kv_aware's prefill_cap ({cap}) is not the engines' --long-prefill-threshold "
        f"({engines}): add --weights prefill_cap={engines}"
    )


def main(argv: Sequence[str]) -> int:
    args = build_parser().parse_args(list(argv))
    problem = usage_problem(args)
    if problem is not None:
        print(f"kvroute bench {args.bench}: error: {problem}", file=sys.stderr)
        return 2
    try:
        note = engine_mismatch(args)
        if note is not None:
            print(f"kvroute bench: note: {note}", file=sys.stderr)
        result = run_bench(args, show_progress=not args.json and sys.stderr.isatty())
    except (OSError, ValueError, RuntimeError) as exc:
        print(f"kvroute bench: {exc}", file=sys.stderr)
        return 2
    text = json.dumps(result, indent=2)
    if args.json:
        print(text)
    else:
        _print_table(result, f"kvroute bench {args.bench}")
    if args.out is not None:
        try:
            Path(args.out).write_text(text + "\n")
        except OSError as exc:  # checked before the run; what the check cannot see
            print(f"kvroute bench: --out {args.out}: {exc.strerror or exc}", file=sys.stderr)
            return 2
    return 0
