"""What ``kvroute bench`` refuses before it runs: flags that would be ignored, clash, or
could not be honoured -- each once replayed into figures that did not say so."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from router.routing.policy import parse_policy_settings


def usage_problem(args: argparse.Namespace) -> str | None:
    """A one-line reason the parsed ``args`` cannot run as asked, or None."""
    return _workload(args) or _engines(args) or _settings(args) or _out(args.out)


def _workload(args: argparse.Namespace) -> str | None:
    if args.synthetic is not None:
        given = {"--trace": args.trace, "--limit": args.limit, "--time-scale": args.time_scale}
        for flag, value in given.items():
            if value is not None:
                return f"{flag} does not apply to --synthetic workloads"
    elif args.mix is not None:
        return "--mix weighs synthetic sessions: it needs --synthetic N"
    if args.load is not None and args.time_scale is not None:
        return "--load sets the arrival speed itself: give --time-scale or --load, not both"
    return None


def _engines(args: argparse.Namespace) -> str | None:
    speeds = len(args.worker_speeds)
    if args.engine_model != "charged":
        if speeds:
            return "--worker-speeds needs --engine-model charged (simple engines share a speed)"
        if args.long_prefill_threshold:
            return "--long-prefill-threshold needs --engine-model charged"
    if speeds > args.workers:
        return f"--worker-speeds gives {speeds} speeds for {args.workers} workers"
    return None


def _settings(args: argparse.Namespace) -> str | None:
    """NaN, infinite and negative values are refused there (``parse_policy_settings``)."""
    try:
        parse_policy_settings(getattr(args, "policy_setting", []))
    except ValueError as exc:
        return str(exc)
    return None


def _out(out: str | None) -> str | None:
    """Refused before the run, not after it: a bad ``--out`` once cost the whole run and
    ended in a traceback."""
    if out is None:
        return None
    path = Path(out)
    if not out.strip():
        return "--out needs a file name"
    if path.is_dir():
        return f"--out {out}: is a directory"
    parent = path.parent
    if not parent.is_dir():
        return f"--out {out}: no directory {str(parent)!r}"
    target = path if path.exists() else parent
    if not os.access(target, os.W_OK):
        return f"--out {out}: not writable"
    return None
