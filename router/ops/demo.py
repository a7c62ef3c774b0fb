"""``kvroute demo``: real engines, the real router, a workload, one table per policy.

Starts N ``kvroute engine`` processes (``router.ops.demo_fleet``; hybrid full +
sliding-window model, CPU offloading on, the shipped ``kvroute-tiny`` tokenizer) and the
router in this process (in-memory index, uvicorn on a free port), then for each policy:
resets the engines' caches and replays the workload as text prompts through the router's
OpenAI proxy with the official ``openai`` client (``x-kvroute-policy`` picks the policy),
and measures on the engines' own answers: prefix hit rate
(``usage.prompt_tokens_details.cached_tokens``), prefill tokens saved, load imbalance, and
how often the router's estimate (``x-kvroute-hit-tokens``) equalled the engine's ``cached_tokens``.

Lossless by construction: after each completion the demo waits until the router has
applied the engine's latest event batch (its ``last_seq``), so every estimate is made on
the engine's exact state. The router's routing clock is the trace's virtual time (prefill backlog
drains at the simulated rate), so a run takes seconds, not the workload's duration; the
proxy releases each request when its response ends.
"""

from __future__ import annotations

import argparse
import asyncio
import heapq
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from router.bench.report import demo_chart, demo_table
from router.bench.sim import CostModel
from router.bench.workloads import MooncakeTrace, Request, SyntheticConfig, synthetic_workload
from router.ops.demo_fleet import (
    MODEL,
    TOKENIZER,
    Engine,
    start_engines,
    start_router,
    stop_engines,
    wait_healthy,
    wait_synced,
)
from router.routing.policy import COMPARED_POLICIES, POLICY_NAMES, check_policy
from router.routing.state import RoutingConfig

DEFAULT_POLICIES = COMPARED_POLICIES


@dataclass
class PolicyRun:
    """What one policy achieved, measured on the engines' answers."""

    policy: str
    workers: list[str]
    prompt_tokens: int = 0
    cached_tokens: int = 0
    requests: int = 0
    exact: int = 0
    abs_err: int = 0
    unsynced: int = 0
    rejected: int = 0
    ttft_sum: float = 0.0
    wall_s: float = 0.0
    tokens_by_worker: dict[str, int] = field(default_factory=dict)
    hit_curve: list[float] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        per = [self.tokens_by_worker.get(w, 0) for w in self.workers]
        mean = sum(per) / len(per) if per else 0.0
        n = max(self.requests, 1)
        return {
            "policy": self.policy,
            "requests": self.requests,
            "hit_rate": round(self.cached_tokens / max(self.prompt_tokens, 1), 5),
            "prefill_tokens_saved": self.cached_tokens,
            "prompt_tokens": self.prompt_tokens,
            "imbalance": round(max(per) / mean, 4) if mean else 1.0,
            "estimate_exact": round(self.exact / n, 5),
            "estimate_mae_tokens": round(self.abs_err / n, 2),
            "ttft_mean_s": round(self.ttft_sum / n, 4),
            "unsynced": self.unsynced,
            "rejected": self.rejected,
            "wall_s": round(self.wall_s, 2),
            "tokens_by_worker": dict(self.tokens_by_worker),
        }


# ----------------------------------------------------------------------- replay
class Demo:
    def __init__(self, args: argparse.Namespace, engines: list[Engine], service: Any, url: str):
        self.args = args
        self.engines = {e.worker_id: e for e in engines}
        self.service = service
        from openai import AsyncOpenAI
        from tokenizers import Tokenizer

        self.openai = AsyncOpenAI(base_url=f"{url}/v1", api_key="-", max_retries=0, timeout=60)
        self.http = httpx.AsyncClient(timeout=60)
        self.tokenizer = Tokenizer.from_file(str(TOKENIZER / "tokenizer.json"))
        self.cost = CostModel()

    async def close(self) -> None:
        await self.openai.close()
        await self.http.aclose()

    async def _batches(self, e: Engine) -> int:
        return int((await self.http.get(f"{e.url}/stats")).json()["batches"])

    async def reset(self) -> None:
        """Empty every engine's caches and wait until the router has seen it."""
        for e in self.engines.values():
            for _ in range(100):
                r = await self.http.post(f"{e.url}/reset_prefix_cache")
                if r.status_code == 200:
                    break
                await asyncio.sleep(0.05)
            if not await wait_synced(self.service, e.worker_id, await self._batches(e)):
                raise RuntimeError(f"the router did not see {e.worker_id}'s reset")

    async def run_policy(self, policy: str, workload: Sequence[Request], tick: Any) -> PolicyRun:
        from router.http.routing import reset_routing

        await self.reset()
        # The router's routing clock is the workload's virtual time, like the engines'
        # simulated service times: backlog draining and TTLs follow the workload.
        clock = [0.0]
        reset_routing(self.service, RoutingConfig(seed=self.args.seed), lambda: clock[0])
        run = PolicyRun(policy, sorted(self.engines))
        prefill_free = dict.fromkeys(self.engines, 0.0)
        # The proxy releases a request when its response ends; the engines answer at once,
        # so the demo keeps each request in flight on the router until its simulated
        # decode ends (virtual time), as a real engine's streaming response would.
        core = self.service.routing
        finishes: list[tuple[float, str]] = []
        t0 = time.perf_counter()
        for req in workload:
            clock[0] = req.arrival
            while finishes and finishes[0][0] <= req.arrival:
                core.finish(heapq.heappop(finishes)[1])
            # Text, as a user sends it: the router and the engine both tokenize it.
            text = self.tokenizer.decode(list(req.token_ids))
            try:
                raw = await self.openai.completions.with_raw_response.create(
                    model=MODEL,
                    prompt=text,
                    max_tokens=min(req.output_tokens, 16),
                    extra_headers={"x-kvroute-policy": policy},
                )
            except openai_errors() as exc:  # e.g. the prompt does not fit this engine's pool
                run.rejected += 1
                if run.rejected == 1:
                    print(f"kvroute demo: {exc}", file=sys.stderr)
                tick()
                continue
            e = self.engines[raw.headers["x-kvroute-worker"]]
            estimate = int(raw.headers["x-kvroute-hit-tokens"])
            usage = raw.parse().usage
            assert usage is not None  # kvroute engines always report usage
            n = usage.prompt_tokens
            details = usage.prompt_tokens_details
            cached = int(details.cached_tokens or 0) if details else 0
            if not await wait_synced(self.service, e.worker_id, await self._batches(e)):
                run.unsynced += 1
            run.requests += 1
            run.prompt_tokens += n
            run.cached_tokens += cached
            run.exact += estimate == cached
            run.abs_err += abs(estimate - cached)
            run.tokens_by_worker[e.worker_id] = run.tokens_by_worker.get(e.worker_id, 0) + n
            run.hit_curve.append(run.cached_tokens / run.prompt_tokens)
            start = max(req.arrival, prefill_free[e.worker_id])
            prefill_free[e.worker_id] = start + (n - cached) / self.cost.prefill_tps
            run.ttft_sum += prefill_free[e.worker_id] - req.arrival
            end = prefill_free[e.worker_id] + req.output_tokens * self.cost.decode_s_per_token
            vid = f"decode-{req.request_id}"
            core.inflight.add(vid, e.worker_id, clock[0], 0.0, float(req.output_tokens))
            heapq.heappush(finishes, (end, vid))
            tick()
        for end, vid in sorted(finishes):
            clock[0] = max(clock[0], end)
            core.finish(vid)
        run.wall_s = time.perf_counter() - t0
        return run


def openai_errors() -> tuple[type[Exception], ...]:
    import openai

    return (openai.BadRequestError, openai.UnprocessableEntityError)


def _workload(args: argparse.Namespace) -> list[Request]:
    from router.proxy.tiny_tokenizer import VOCAB

    # Token ids inside the tiny tokenizer's word range, so they survive decode -> encode.
    if args.trace:
        trace = MooncakeTrace(args.trace, limit=args.requests, seed=args.seed, vocab=VOCAB)
        return list(trace)
    cfg = SyntheticConfig(
        requests=args.requests, seed=args.seed, system_prompts=args.system_prompts, vocab=VOCAB
    )
    return synthetic_workload(cfg)


async def run_demo(args: argparse.Namespace) -> list[PolicyRun]:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    workload = _workload(args)
    logdir = Path(tempfile.mkdtemp(prefix="kvroute-demo-"))
    engines = start_engines(args, logdir)
    runs: list[PolicyRun] = []
    columns = (TextColumn("{task.description:<16}"), BarColumn(), MofNCompleteColumn())
    try:
        async with httpx.AsyncClient() as probe:
            await wait_healthy(probe, engines, args.start_timeout)
        async with start_router(engines) as (service, url):
            demo = Demo(args, engines, service, url)
            try:
                with Progress(*columns, disable=args.quiet, transient=False) as bar:
                    for policy in args.policies:
                        task = bar.add_task(policy, total=len(workload))
                        runs.append(
                            await demo.run_policy(
                                policy,
                                workload,
                                lambda t=task: bar.advance(t),
                            )
                        )
            finally:
                await demo.close()
    finally:
        stop_engines(engines)
    shutil.rmtree(logdir, ignore_errors=True)  # kept (and quoted) only when start-up failed
    return runs


def _policies(text: str) -> list[str]:
    names = [p.strip() for p in text.split(",") if p.strip()]
    if not names:
        raise argparse.ArgumentTypeError(f"no policy given; choose from {POLICY_NAMES}")
    try:
        return [check_policy(name) for name in names]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="kvroute demo",
        description="Start simulated engines and the router, replay a workload through "
        "the router's OpenAI proxy with each policy, and compare engine-measured cache hits.",
    )
    p.add_argument("--workers", type=int, default=4, help="simulated engines to start")
    p.add_argument("--requests", type=int, default=600, help="requests per policy")
    p.add_argument("--policies", type=_policies, default=list(DEFAULT_POLICIES),
                   help=f"comma-separated, from {', '.join(POLICY_NAMES)}")  # fmt: skip
    p.add_argument("--trace", default=None,
                   help="Mooncake JSONL instead of the synthetic mix (its prompts are long: "
                   "raise --gpu-blocks to 2x the longest prompt / 16)")  # fmt: skip
    p.add_argument("--system-prompts", type=int, default=1,
                   help="synthetic: distinct system prompts after the shared preamble "
                   "(1 = one application: a prefix every request shares)")  # fmt: skip
    p.add_argument(
        "--groups",
        default="full:64,swa:16:32",
        help="engine KV cache groups (default: hybrid whose sliding-window stores are sparse)",
    )
    # Small enough that where requests go decides what stays cached.
    p.add_argument("--gpu-blocks", type=int, default=768, help="per engine")
    p.add_argument("--cpu-blocks", type=int, default=256, help="per engine; 0 = no offload")
    p.add_argument("--seed", type=int, default=0, help="workload random seed")
    p.add_argument("--out", default="artifacts/demo.png", help="PNG chart path")
    p.add_argument("--json", default=None, help="also write the results as JSON here")
    p.add_argument("--start-timeout", type=float, default=120.0, help="engine start-up, s")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def main(argv: Sequence[str]) -> int:
    args = build_parser().parse_args(list(argv))
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    started = time.perf_counter()
    try:
        runs = asyncio.run(run_demo(args))
    except (RuntimeError, OSError, httpx.HTTPError) as exc:
        print(f"kvroute demo: {exc}", file=sys.stderr)
        return 1
    summaries = [run.summary() for run in runs]
    demo_table(summaries, args)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    demo_chart(summaries, [r.hit_curve for r in runs], out)
    print(f"chart: {out}   total {time.perf_counter() - started:.1f}s")
    if args.json:
        Path(args.json).write_text(json.dumps({"policies": summaries}, indent=2) + "\n")
    return 0
