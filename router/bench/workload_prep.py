"""The workload a benchmark replays: source, held-out slice, arrival scaling for a load.

``--slice a:b`` keeps requests ``[a*len, b*len)`` by arrival order (tune on one slice,
report on another); ``--load L`` rescales arrivals so the fleet's offered load is ``L``
(:mod:`router.bench.load`); ``--mix`` picks the synthetic session kinds.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Iterable, Sequence
from pathlib import Path

from router.bench.charged import ChargedModel
from router.bench.load import block_keys, shared_lru_hits, time_scale_for, work_seconds
from router.bench.workloads import (
    MOONCAKE_BLOCK,
    MooncakeTrace,
    Request,
    SyntheticConfig,
    synthetic_workload,
)

DEFAULT_TRACE = "benchmarks/data/mooncake_conversation_trace.jsonl"


def parse_slice(text: str) -> tuple[float, float]:
    a, sep, b = text.partition(":")
    try:
        lo, hi = float(a or 0.0), float(b or 1.0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"bad slice {text!r}; expected a:b") from None
    if not sep or not 0.0 <= lo < hi <= 1.0:
        raise argparse.ArgumentTypeError(f"bad slice {text!r}; need 0 <= a < b <= 1")
    return lo, hi


def parse_floats(text: str) -> tuple[float, ...]:
    try:
        values = tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"bad list {text!r}") from None
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"bad list {text!r}; positive numbers expected")
    return values


def _cut(n: int, bounds: tuple[float, float] | None) -> slice:
    if bounds is None:
        return slice(0, n)
    return slice(int(bounds[0] * n), int(bounds[1] * n))


def _capacity(args: argparse.Namespace) -> float:
    speeds = args.worker_speeds or (1.0,)
    return sum(speeds[i % len(speeds)] for i in range(args.workers))


def load_workload(args: argparse.Namespace) -> tuple[Iterable[Request], str, float]:
    """(requests, label, arrival speed-up applied)."""
    model = ChargedModel() if args.engine_model == "charged" else None
    capacity_blocks = args.workers * args.gpu_blocks
    if args.synthetic is not None:
        mix = args.mix or SyntheticConfig().mix
        cfg = SyntheticConfig(requests=args.synthetic, seed=args.seed, mix=mix)
        reqs = synthetic_workload(cfg)[_cut(args.synthetic, args.slice)]
        label = f"synthetic({args.synthetic}, mix={mix}, seed={args.seed})"
        scale = 1.0
        if args.load is not None:
            bs = args.block_size
            hits = shared_lru_hits(
                ((len(r.token_ids), block_keys(r.token_ids, bs)) for r in reqs), capacity_blocks, bs
            )
            work = [
                work_seconds(len(r.token_ids), h, r.output_tokens, model, args.prefill_tps)
                for r, h in zip(reqs, hits, strict=True)
            ]
            scale = time_scale_for(args.load, [r.arrival for r in reqs], work, _capacity(args))
            reqs = [dataclasses.replace(r, arrival=r.arrival / scale) for r in reqs]
        return reqs, _label(label, args, scale), scale
    path = Path(args.trace or DEFAULT_TRACE)
    trace = MooncakeTrace(path, limit=args.limit, seed=args.seed, time_scale=args.time_scale)
    trace.records = trace.records[_cut(len(trace.records), args.slice)]
    scale = args.time_scale
    if args.load is not None and trace.records:
        if args.block_size != MOONCAKE_BLOCK:
            raise ValueError("--load on a Mooncake trace needs --block-size 512")
        recs = trace.records
        hits = shared_lru_hits(((r.input_length, r.hash_ids) for r in recs), capacity_blocks, 512)
        work = [
            work_seconds(r.input_length, h, r.output_length, model, args.prefill_tps)
            for r, h in zip(recs, hits, strict=True)
        ]
        extra = time_scale_for(args.load, [r.arrival for r in recs], work, _capacity(args))
        trace.records = [dataclasses.replace(r, arrival=r.arrival / extra) for r in recs]
        scale *= extra
    return trace, _label(f"{path.name} ({len(trace)} requests)", args, scale), scale


def _label(base: str, args: argparse.Namespace, scale: float) -> str:
    parts = [base]
    if args.slice is not None:
        parts.append(f"slice {args.slice[0]:g}:{args.slice[1]:g}")
    if args.load is not None:
        parts.append(f"load {args.load:g} (arrivals x{scale:.3g})")
    return ", ".join(parts)


def mix_arg(text: str) -> tuple[float, float, float]:
    values: Sequence[float] = [float(x) for x in text.split(",")]
    if len(values) != 3 or any(v < 0 for v in values) or sum(values) <= 0:
        raise argparse.ArgumentTypeError("--mix takes chat,agent,fanout weights, e.g. 1,0,0")
    return (values[0], values[1], values[2])
