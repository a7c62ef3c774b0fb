"""The routing policy's own cost per request: ``RoutingCore.route`` + ``finish``.

What the proxy runs between scoring a prompt and forwarding it (issue 16): build a view
per worker, cost them, record the choice; later ``finish``. Measured in process on the
same workload for two implementations in one run, repeats interleaved so machine load
hits both alike: ``before`` is ``router/routing`` at ``--before`` (a git ref, read with
``git show`` and loaded under another package name), ``after`` is the working tree.
Both must choose the same workers for the whole sequence (checked; the decisions test is
``tests/router/routing/test_route_replay.py``), so ``after`` runs with the weights the
default ref had (``AS_BEFORE``: the share prior's 4-request warm-up, no round-4 terms, no
pressure gate).

Workload: 256-token prompts (as ``benchmarks/proxy.py``) from 32 sessions over 4 system
prompts; each worker's score 0 except 1-3 workers holding part of the prompt; up to
``--inflight`` requests open (finished in dispatch order), a clock stepping 0.2 ms a call.
Run: ``python benchmarks/route_cost.py [--workers 64] [--requests 4000] [--repeats 3]
[--before REF] [--policy kv_aware] [--profile]``.
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import importlib
import importlib.abc
import importlib.util
import itertools
import pstats
import random
import subprocess
import sys
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

# main when this benchmark was written, before the round-3c speed-ups (issue 16).
DEFAULT_BEFORE = "065c969"
# The defaults that changed since DEFAULT_BEFORE (decisions, on purpose; issue 15).
AS_BEFORE = {
    "share_warmup": 4.0,
    "large_tokens": 0.0,
    "ttft_miss": 0.0,
    "share_roomy": 1.0,
    "share_evicting": 1.0,
}


@dataclass(slots=True)
class Score:
    worker_id: str
    hit_tokens: int = 0
    hit_tokens_gpu: int = 0
    score: float = 0.0


class _GitFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports ``_route_before.X`` from ``git show REF:router/routing/X.py`` (its
    ``router.routing.`` imports renamed), so any ref's module layout loads."""

    def __init__(self, ref: str) -> None:
        self.ref = ref

    def find_spec(self, name: str, path: object, target: object = None) -> Any:
        if not name.startswith("_route_before."):
            return None
        return importlib.util.spec_from_loader(name, self)

    def create_module(self, spec: Any) -> None:
        return None

    def exec_module(self, module: ModuleType) -> None:
        leaf = module.__name__.rsplit(".", 1)[1]
        src = subprocess.run(
            ["git", "show", f"{self.ref}:router/routing/{leaf}.py"],
            cwd=REPO,
            check=True,
            capture_output=True,
            text=True,
        ).stdout.replace("router.routing.", "_route_before.")
        exec(compile(src, f"{self.ref}:router/routing/{leaf}.py", "exec"), module.__dict__)


def load_before(ref: str) -> ModuleType:
    """``router.routing.state`` as of ``ref``, as module ``_route_before.state``."""
    pkg = ModuleType("_route_before")
    pkg.__path__ = []
    sys.modules["_route_before"] = pkg
    sys.meta_path.insert(0, _GitFinder(ref))
    return importlib.import_module("_route_before.state")


def workload(workers: int, requests: int, seed: int = 1) -> list[tuple[list[int], list[Score]]]:
    rng = random.Random(seed)
    ids = [f"worker-{i:02d}" for i in range(workers)]
    systems = [[rng.randrange(50_000) for _ in range(128)] for _ in range(4)]
    sessions = [rng.choice(systems) + [rng.randrange(50_000) for _ in range(64)] for _ in range(32)]
    out = []
    for _ in range(requests):
        tokens = rng.choice(sessions) + [rng.randrange(50_000) for _ in range(64)]
        scores = [Score(w) for w in ids]
        for i in rng.sample(range(workers), rng.randint(1, 3)):
            hit = 16 * rng.randrange(1, 13)
            scores[i] = Score(ids[i], hit, hit, float(hit))
        out.append((tokens, scores))
    return out


def run_once(
    state: Any, work: list, policy: str, inflight: int, weights: dict[str, float] | None = None
) -> tuple[float, list[str]]:
    """Seconds per request (route + finish), and the chosen workers; ``weights`` replace
    defaults of ``state``'s ``PolicyWeights``."""
    ticks = itertools.count()
    config = state.RoutingConfig(seed=5)
    if weights:
        config = dataclasses.replace(config, weights=dataclasses.replace(config.weights, **weights))
    # A deterministic clock (0.2 ms a call): both implementations see the same times.
    core = state.RoutingCore(config, clock=lambda: next(ticks) * 2e-4)
    route, finish = core.route, core.finish
    open_: deque[str] = deque()
    chosen: list[str] = []
    t0 = time.perf_counter()
    for i, (tokens, scores) in enumerate(work):
        d = route(f"r{i}", tokens, scores, policy=policy)
        chosen.append(d.worker_id)
        open_.append(d.request_id)
        if len(open_) > inflight:
            finish(open_.popleft())
    elapsed = time.perf_counter() - t0
    return elapsed / len(work), chosen


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workers", type=int, default=64)
    ap.add_argument("--requests", type=int, default=4000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--inflight", type=int, default=8)
    ap.add_argument("--policy", default="kv_aware")
    ap.add_argument("--before", default=DEFAULT_BEFORE, help="git ref of the old code")
    ap.add_argument("--profile", action="store_true", help="cProfile the current code")
    args = ap.parse_args()

    from router.routing import state as after

    before = load_before(args.before)
    work = workload(args.workers, args.requests)
    if args.profile:
        prof = cProfile.Profile()
        prof.runcall(run_once, after, work, args.policy, args.inflight)
        pstats.Stats(prof).sort_stats("tottime").print_stats(18)
        return
    times: dict[str, list[float]] = {"before": [], "after": []}
    choices: dict[str, list[str]] = {}
    for _ in range(args.repeats):
        for label, state, weights in (("before", before, None), ("after", after, AS_BEFORE)):
            per_request, chosen = run_once(state, work, args.policy, args.inflight, weights)
            times[label].append(per_request * 1e6)
            choices[label] = chosen
    same = choices["before"] == choices["after"]
    print(
        f"{args.workers} workers, {args.requests} requests, policy {args.policy}, "
        f"{args.inflight} in flight; before = {args.before}; same choices: {same}"
    )
    for label, us in times.items():
        print(f"  {label:6s} route+finish us/request: {min(us):7.1f}-{max(us):7.1f}")
    ratios = [b / a for b, a in zip(times["before"], times["after"], strict=True)]
    print(f"  before/after per repeat: {min(ratios):.2f}-{max(ratios):.2f}x")
    if not same:
        raise SystemExit("the two implementations chose different workers")


if __name__ == "__main__":
    main()
