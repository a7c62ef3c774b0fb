"""The workload a benchmark replays: source, held-out slice, arrival scaling for a load.

``--slice a:b`` keeps requests ``[a*len, b*len)`` by arrival order (tune on one slice,
report on another); ``--load L`` rescales arrivals so the fleet's offered load is ``L``
(:mod:`router.bench.load`); ``--mix`` picks the synthetic session kinds.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TypeVar

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
    # NaN passed ``v <= 0`` and made every TTFT NaN; an infinite speed, a free engine.
    if not values or any(not math.isfinite(v) or v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"bad list {text!r}; positive finite numbers expected")
    return values


_N = TypeVar("_N", int, float)


def _checked(text: str, value: float, strict: bool) -> None:
    # NaN and infinities compare false or run away: every figure after them is garbage.
    if not math.isfinite(value) or value < 0 or (strict and value == 0):
        kind = "a whole number" if isinstance(value, int) else "a finite number"
        raise argparse.ArgumentTypeError(f"{text!r}: need {kind} {'>' if strict else '>='} 0")


def _number(text: str, parse: Callable[[str], _N], strict: bool) -> _N:
    """``text`` parsed by ``int`` or ``float``, refused unless finite and > 0 (``strict``)
    or >= 0."""
    try:
        value = parse(text)
    except ValueError:
        what = "a whole number" if parse is int else "a number"
        raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None
    _checked(text, value, strict)
    return value


def positive_int(text: str) -> int:
    return _number(text, int, strict=True)


def non_negative_int(text: str) -> int:
    return _number(text, int, strict=False)


def positive_float(text: str) -> float:
    return _number(text, float, strict=True)


def non_negative_float(text: str) -> float:
    return _number(text, float, strict=False)


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
        if not reqs:
            raise ValueError(f"{label}: {_nothing(args, args.synthetic)}")
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
    time_scale = 1.0 if args.time_scale is None else args.time_scale
    trace = MooncakeTrace(path, limit=args.limit, seed=args.seed, time_scale=time_scale)
    read = len(trace.records)
    trace.records = trace.records[_cut(read, args.slice)]
    # An empty trace (or one whose every line was malformed) replayed into figures of 0.0
    # that read like a run; lines skipped as malformed are named with the figures.
    n = trace.skipped
    skipped = f", {n} malformed line{'s' if n > 1 else ''} skipped" if n else ""
    if not trace.records:
        what = f"{read} valid lines{skipped}" if read else f"no valid lines{skipped}"
        raise ValueError(f"{path}: {what}: {_nothing(args, read)}")
    scale = time_scale
    if args.load is not None:
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
    return trace, _label(f"{path.name} ({len(trace)} requests{skipped})", args, scale), scale


def _nothing(args: argparse.Namespace, total: int) -> str:
    if total and args.slice is not None:
        return f"--slice {args.slice[0]:g}:{args.slice[1]:g} of {total} requests is empty"
    return "no requests to replay"


def _label(base: str, args: argparse.Namespace, scale: float) -> str:
    parts = [base]
    if args.slice is not None:
        parts.append(f"slice {args.slice[0]:g}:{args.slice[1]:g}")
    if args.load is not None:
        parts.append(f"load {args.load:g} (arrivals x{scale:.3g})")
    return ", ".join(parts)


def mix_arg(text: str) -> tuple[float, float, float]:
    values: Sequence[float] = [float(x) for x in text.split(",")]
    bad = any(not math.isfinite(v) or v < 0 for v in values)
    if len(values) != 3 or bad or sum(values) <= 0:
        raise argparse.ArgumentTypeError("--mix takes chat,agent,fanout weights, e.g. 1,0,0")
    return (values[0], values[1], values[2])
