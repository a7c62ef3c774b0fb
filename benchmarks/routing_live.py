"""Routing with real processes: multi-turn chats from concurrent ``openai`` clients.

N ``kvroute engine`` processes (tiny tokenizer, a small GPU pool so caches are under
pressure, simulated prefill time per *uncached* token, one prefill at a time per engine,
and a simulated decode step) serve the same seeded conversations once per way of routing,
each on a fresh fleet:

* ``kv_aware`` / ``round_robin`` -- through ``kvroute serve``'s OpenAI proxy
  (``x-kvroute-policy`` picks the policy);
* ``pinned`` -- the client sends every turn of a conversation straight to one engine
  (a hash of the conversation id picks it: perfect session affinity, blind to shared
  system prompts and to load);
* ``vllm-router`` / ``sglang-router`` -- their ``cache_aware`` policies in front of the
  same engines, when installed (``--vllm-router PATH`` / ``--sglang-router PATH``,
  default ``.venv-peers/{vllm,sglang}-router/bin/...``, which ``make bench-proxy-peers``
  installs).

Per way: the share of prompt tokens the engines reported as cached
(``usage.prompt_tokens_details.cached_tokens``, summed over every turn), time to the first
streamed chunk as the client sees it (p50/p99), and the prompt-token imbalance over the
engines (max / mean of the engines' own ``/stats``). Loopback only; bounded in requests.

    .venv/bin/python benchmarks/routing_live.py [--workers 4] [--clients 8] \
        [--conversations 64] [--turns 5] [--vllm-router PATH] [--json OUT]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx
from openai import APITimeoutError, AsyncOpenAI

from benchmarks.proxy import MODEL, REPO, TOKENIZER, start, stop_all, wait_http
from benchmarks.stats import pct
from router.netutil import free_ports
from router.proxy.tiny_tokenizer import words

WAYS = ("kv_aware", "round_robin", "pinned")
# A way through kvroute's proxy may name a route profile: ``kv_aware@few-sessions``.
ROUTED = ("kv_aware", "round_robin")


def policy_of(way: str) -> str:
    """The policy part of a way (``kv_aware@few-sessions`` -> ``kv_aware``)."""
    return way.partition("@")[0]


def conversations(args: argparse.Namespace) -> list[list[list[dict[str, str]]]]:
    """Per conversation, the user messages of each turn (system prompt first)."""
    rng = random.Random(args.seed)
    vocab = words()
    systems = [" ".join(rng.choices(vocab, k=args.system_words)) for _ in range(args.systems)]
    out = []
    for c in range(args.conversations):
        sys_msg = {"role": "system", "content": systems[c % args.systems]}
        turns = [
            [{"role": "user", "content": " ".join(rng.choices(vocab, k=args.user_words))}]
            for _ in range(args.turns)
        ]
        out.append([[sys_msg], *turns])
    return out


class Fleet:
    """N engines plus the front door of one way of routing, started fresh."""

    def __init__(self, args: argparse.Namespace, way: str, tmp: Path) -> None:
        self.args, self.way, self.tmp = args, way, tmp
        self.procs: list[subprocess.Popen[bytes]] = []
        self.engines: list[str] = []
        self.front = ""

    async def __aenter__(self) -> Fleet:
        a = self.args
        ports = free_ports(3 * a.workers + 1)
        specs = []
        for i in range(a.workers):
            http, pub, rep = ports[3 * i : 3 * i + 3]
            self.procs.append(start([
                sys.executable, "-m", "router.cli", "engine", "--port", str(http),
                "--worker-id", f"e{i}", "--publish", f"tcp://127.0.0.1:{pub}",
                "--replay", f"tcp://127.0.0.1:{rep}", "--gpu-blocks", str(a.gpu_blocks),
                "--cpu-blocks", "0", "--tokenizer", str(TOKENIZER), "--log-level", "warning",
                "--token-delay-ms", str(a.token_delay_ms),
                "--prefill-us-per-token", str(a.prefill_us_per_token),
            ], self.tmp / f"{self.way}-e{i}.log"))  # fmt: skip
            self.engines.append(f"http://127.0.0.1:{http}")
            specs.append(
                f"e{i}=tcp://127.0.0.1:{pub},replay=tcp://127.0.0.1:{rep},http={self.engines[-1]}"
            )
        async with httpx.AsyncClient() as c:  # peers register workers once, at start-up
            for e in self.engines:
                await wait_http(f"{e}/health")
        front = ports[-1]
        if policy_of(self.way) in ROUTED:
            profile = self.way.partition("@")[2] or a.route_profile
            self.procs.append(start([
                sys.executable, "-m", "router.cli", "serve", "--port", str(front),
                "--tokenizer", str(TOKENIZER), "--log-level", "warning",
                *[x for s in specs for x in ("--worker", s)],
            ], self.tmp / f"{self.way}-router.log", {  # the engines' prefill speed, as an
                # operator would configure it (route_prefill_tps drains the backlog)
                "KVROUTE_ROUTE_PREFILL_TPS": str(1e6 / max(a.prefill_us_per_token, 1.0)),
                **({"KVROUTE_ROUTE_WEIGHTS": a.route_weights} if a.route_weights else {}),
                **({"KVROUTE_ROUTE_PROFILE": profile} if profile else {}),
            }))  # fmt: skip
            self.front = f"http://127.0.0.1:{front}"
        elif self.way == "vllm-router":
            self.procs.append(start([
                a.vllm_router, "--host", "127.0.0.1", "--port", str(front),
                "--worker-urls", *self.engines, "--policy", "cache_aware",
            ], self.tmp / "vllm-router.log"))  # fmt: skip
            self.front = f"http://127.0.0.1:{front}"
        elif self.way == "sglang-router":
            metrics = free_ports(1)[0]
            self.procs.append(start([
                a.sglang_router, "launch", "--host", "127.0.0.1", "--port", str(front),
                "--worker-urls", *self.engines, "--policy", "cache_aware",
                "--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics),
            ], self.tmp / "sglang-router.log"))  # fmt: skip
            self.front = f"http://127.0.0.1:{front}"
        async with httpx.AsyncClient() as c:
            if policy_of(self.way) in ROUTED:
                await wait_http(f"{self.front}/v1/models")
                deadline = time.monotonic() + 60
                while not all(
                    w["live"]
                    for w in (await c.get(f"{self.front}/v1/proxy/workers")).json()["workers"]
                ):
                    if time.monotonic() > deadline:
                        raise RuntimeError("workers not live")
                    await asyncio.sleep(0.2)
            elif self.front:
                await wait_http(f"{self.front}/health")
                await self._probe(c)
        return self

    async def _probe(self, c: httpx.AsyncClient, timeout: float = 60) -> None:
        """Until a one-word chat answers 200 (a peer adds its workers in the background)."""
        body = {"model": MODEL, "messages": [{"role": "user", "content": words()[0]}]}
        deadline = time.monotonic() + timeout
        while True:
            try:
                r = await c.post(
                    f"{self.front}/v1/chat/completions", json={**body, "max_tokens": 1}
                )
                if r.status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.way} does not route after {timeout}s")
            await asyncio.sleep(0.5)

    async def __aexit__(self, *exc: object) -> None:
        stop_all(self.procs)

    async def engine_prompt_tokens(self) -> list[int]:
        async with httpx.AsyncClient() as c:
            stats = [(await c.get(f"{e}/stats")).json() for e in self.engines]
        return [int(s.get("prompt_tokens", 0)) for s in stats]


async def chat(
    fleet: Fleet,
    convs: list[list[list[dict[str, str]]]],
    trace: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """One way's run of every conversation; with ``trace``, one record per turn is
    appended to it (when it started, TTFT, prompt and cached tokens, and where the
    router's proxy says it sent it with what estimate)."""
    a, way = fleet.args, fleet.way
    routed = policy_of(way) in ROUTED
    headers = {"x-kvroute-policy": policy_of(way)} if routed else {}
    clients = [
        AsyncOpenAI(base_url=f"{u}/v1", api_key="unused", max_retries=0, timeout=120)
        for u in (fleet.engines if way == "pinned" else [fleet.front])
    ]
    queue: asyncio.Queue[int] = asyncio.Queue()
    for c in range(len(convs)):
        queue.put_nowait(c)
    prompt = cached = timeouts = 0
    ttft: list[float] = []

    async def turn_once(
        client: AsyncOpenAI, history: list[Any]
    ) -> tuple[float, str, Any, dict[str, str]]:
        t0 = time.perf_counter()
        raw = await client.chat.completions.with_raw_response.create(
            model=MODEL, messages=history, max_tokens=a.output_words, stream=True,
            stream_options={"include_usage": True}, extra_headers=headers,
        )  # fmt: skip
        routed = {k: v for k, v in raw.headers.items() if k.startswith("x-kvroute-")}
        stream = raw.parse()
        first, text, usage = None, [], None
        async for chunk in stream:
            if first is None:
                first = time.perf_counter() - t0
            if chunk.choices and chunk.choices[0].delta.content:
                text.append(chunk.choices[0].delta.content)
            if chunk.usage is not None:
                usage = chunk.usage
        return first or 0.0, "".join(text), usage, routed

    async def one(c: int) -> None:
        nonlocal prompt, cached, timeouts
        pin = int.from_bytes(hashlib.sha256(f"conversation-{c}".encode()).digest()[:8], "big")
        client = clients[pin % len(clients)]
        history = list(convs[c][0])
        for t, turn in enumerate(convs[c][1:]):
            history += turn
            started = time.perf_counter() - t_begin
            for attempt in range(3):  # a turn that hangs is retried (and counted)
                try:
                    first, text, usage, routed = await asyncio.wait_for(
                        turn_once(client, history), 30
                    )
                    break
                except (TimeoutError, APITimeoutError):
                    timeouts += 1
                    if attempt == 2:
                        raise
            if usage is not None:
                prompt += usage.prompt_tokens
                details = usage.prompt_tokens_details
                cached += (details.cached_tokens or 0) if details else 0
            ttft.append(first)
            if trace is not None:
                details = usage.prompt_tokens_details if usage is not None else None
                trace.append({
                    "conversation": c, "turn": t, "start_s": round(started, 4),
                    "ttft_s": round(first, 4),
                    "prompt": usage.prompt_tokens if usage is not None else None,
                    "cached": (details.cached_tokens or 0) if details else 0,
                    "worker": routed.get("x-kvroute-worker", f"e{pin % len(clients)}"
                                         if way == "pinned" else None),
                    "estimated": int(routed["x-kvroute-hit-tokens"])
                    if "x-kvroute-hit-tokens" in routed else None,
                })  # fmt: skip
            history.append({"role": "assistant", "content": text.strip()})

    async def client_loop() -> None:
        while not queue.empty():
            await one(queue.get_nowait())

    t0 = t_begin = time.perf_counter()
    try:
        await asyncio.gather(*(client_loop() for _ in range(a.clients)))
    finally:
        # Close the clients here, never leave them to the garbage collector. An openai
        # client is a reference cycle (its resources point back at it), so the cyclic GC
        # frees it at some point during the *next* way's first burst of requests; then
        # (1) each idle connection's asyncio transport finalizer closes its socket, whose
        # fd number a new connection gets at once, and (2) openai's
        # AsyncHttpxClientWrapper.__del__ schedules aclose(), which aborts those transports
        # and so removes the *new* connection's reader from the event loop's selector (by
        # fd number). That stream never reads the answer the engine sent in full, and its
        # turn hangs until one()'s 30 s wait_for gives up (turns_retried_after_30s).
        for client in clients:
            await client.close()
    wall = time.perf_counter() - t0
    per = await fleet.engine_prompt_tokens()
    mean = sum(per) / len(per)
    return {
        "requests": len(ttft),
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "reuse": round(cached / max(prompt, 1), 4),
        "ttft_p50_ms": round(1000 * pct(ttft, 0.5), 1),
        "ttft_p99_ms": round(1000 * pct(ttft, 0.99), 1),
        "imbalance": round(max(per) / mean, 3) if mean else 1.0,
        "wall_s": round(wall, 1),
        "turns_retried_after_30s": timeouts,
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="kvroute-routing-live-"))
    convs = conversations(args)
    asked = args.ways.split(",")
    ways = [w for w in WAYS if w in asked]
    ways += [w for w in asked if "@" in w and policy_of(w) in ROUTED]
    for name in ("vllm_router", "sglang_router"):
        path = getattr(args, name) or str(
            REPO / f".venv-peers/{name.replace('_', '-')}/bin/{name.replace('_', '-')}"
        )
        if name.replace("_", "-") not in args.ways.split(","):
            continue
        if Path(path).exists():
            setattr(args, name, path)
            ways.append(name.replace("_", "-"))
        else:
            print(f"{name.replace('_', '-')} not found at {path}: skipped", file=sys.stderr)
    out: dict[str, Any] = {"config": vars(args), "ways": {}}
    for rep in range(args.repeats):
        for way in ways:
            try:
                turns: list[dict[str, Any]] | None = [] if args.trace else None
                async with Fleet(args, way, tmp) as fleet:
                    r = await asyncio.wait_for(chat(fleet, convs, turns), args.way_timeout_s)
                if args.trace and turns is not None:
                    with open(args.trace, "a") as f:
                        for row in turns:
                            f.write(json.dumps({"repeat": rep, "way": way, **row}) + "\n")
            except Exception as exc:  # a peer that hangs or fails: recorded, the rest go on
                out.setdefault("failures", []).append(f"repeat {rep} {way}: {exc!r}")
                print(f"repeat {rep} {way:12s} FAILED: {exc!r}", flush=True)
                continue
            out["ways"].setdefault(way, []).append(r)
            print(f"repeat {rep} {way:12s} {r}", flush=True)
            if args.json:
                Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    return out


def table(result: dict[str, Any]) -> str:
    """Markdown: per way, ranges over the repeats. A repeat in which a turn hung and was
    retried is left out (the retry finds its own first attempt's prefill cached, which
    inflates reuse) and counted in the last column, as are failed repeats."""

    def rng(rows: list[dict[str, Any]], key: str, fmt: str) -> str:
        if not rows:
            return "-"
        lo, hi = min(r[key] for r in rows), max(r[key] for r in rows)
        return format(lo, fmt) if lo == hi else f"{lo:{fmt}}-{hi:{fmt}}"

    failed: dict[str, int] = {}
    for line in result.get("failures", []):
        way = line.split(":")[0].split()[-1]
        failed[way] = failed.get(way, 0) + 1
    head = "| routing | reuse (cached / prompt tokens) | TTFT p50 ms | TTFT p99 ms | imbalance |"
    lines = [head + " repeats left out |", "|---|---|---|---|---|---|"]
    for way, all_rows in result["ways"].items():
        rows = [r for r in all_rows if not r.get("turns_retried_after_30s")]
        out = len(all_rows) - len(rows) + failed.get(way, 0)
        lines.append(
            f"| {way} | {rng(rows, 'reuse', '.3f')} | {rng(rows, 'ttft_p50_ms', '.0f')} "
            f"| {rng(rows, 'ttft_p99_ms', '.0f')} | {rng(rows, 'imbalance', '.2f')} | {out} |"
        )
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--clients", type=int, default=8, help="concurrent conversations")
    p.add_argument("--conversations", type=int, default=64)
    p.add_argument("--turns", type=int, default=5)
    p.add_argument("--systems", type=int, default=4, help="distinct system prompts")
    p.add_argument("--system-words", type=int, default=300)
    p.add_argument("--user-words", type=int, default=80)
    p.add_argument("--output-words", type=int, default=24)
    p.add_argument("--gpu-blocks", type=int, default=320, help="16-token blocks per engine")
    p.add_argument("--prefill-us-per-token", type=float, default=200.0)
    p.add_argument("--token-delay-ms", type=float, default=2.0)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--way-timeout-s", type=float, default=180.0, help="per way and repeat")
    p.add_argument("--ways", default="kv_aware,round_robin,pinned,vllm-router,sglang-router")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--vllm-router", default=None, help="path to a vllm-router binary")
    p.add_argument("--sglang-router", default=None, help="path to a sglang-router binary")
    p.add_argument("--route-weights", default=None, help="kvroute serve's route_weights, as JSON")
    p.add_argument("--route-profile", default=None, help="kvroute serve's route_profile")
    p.add_argument("--json", default=None)
    p.add_argument("--trace", default=None, help="append one JSON line per turn to this file")
    p.add_argument("--report", nargs="+", default=None, help="print tables of saved --json files")
    args = p.parse_args()
    if args.report:
        for path in args.report:
            print(f"{path}:\n\n{table(json.loads(Path(path).read_text()))}\n")
        return 0
    result = asyncio.run(run(args))
    print(table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
