"""Cache reuse side by side: the same multi-turn workload, sent with concurrent official
``openai`` clients through kvroute and through the peer routers, in front of the same
``kvroute engine`` processes (their prefix caches reset between targets).

Targets (each skipped with a message when its router is not installed):

* ``kvroute`` -- ``kvroute serve`` with ``kv_aware`` (its default) in a router of its own,
  and a second one for ``x-kvroute-policy: longest_prefix`` (cache only) and
  ``round_robin`` (reference); ``--kvroute-weights JSON`` adds a ``kv_aware`` router with
  those weights (``KVROUTE_ROUTE_WEIGHTS``);
* ``vllm-router kv_aware`` -- vllm-router with ``--kv-event-source`` on the engines' PUB
  sockets (and ``--kv-event-replay-source``), and ``vllm-router cache_aware``;
* ``sglang-router cache_aware`` -- it rejects token-id prompts, so it gets the same
  conversations as text (the tiny word-level tokenizer makes both the same token ids);
* ``pinning`` -- each conversation sent straight to one engine (hash of its id), what a
  sticky-session load balancer does.

Reported per target, from the engines' own ``/stats`` (not the router's): hit rate
(cached prompt tokens / prompt tokens), imbalance (most requests on one engine / the
mean), p50/p99 request latency under the workload (confounded by the hit rate and by CPU
contention on a small machine), and added p50 from a separate probe after each target's
run: sequential requests through the router vs straight to an engine. Peers come from
``.venv-peers/``. Run: ``make bench-proxy-peers`` (installs them), or ``python
benchmarks/proxy_reuse.py [--conversations 48] [--turns 6] [--clients 8] [--runs 3]
[--kvroute-weights '{"decode": 32}'] [--json OUT]``: min-max over the runs. Loopback only.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import subprocess
import sys
import tempfile
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx
import openai
from tokenizers import Tokenizer

from benchmarks.proxy import MODEL, REPO, TOKENIZER, report, start, stop_all, wait_http, wait_live
from benchmarks.stats import pct
from router.netutil import free_ports

PEERS = REPO / ".venv-peers"


@dataclass
class Conversation:
    cid: int
    turns: list[str]  # the prompt text of each turn (history included)


def workload(args: argparse.Namespace) -> list[Conversation]:
    """Conversations over a few shared system prompts; turn k's prompt is the history
    (system, user and assistant turns) plus the new user turn, so it extends turn k-1's."""
    vocab = [w for w in Tokenizer.from_file(str(TOKENIZER / "tokenizer.json")).get_vocab()]
    words = sorted(w for w in vocab if w.isalpha())
    rng = random.Random(args.seed)

    def text(n: int) -> str:
        return " ".join(rng.choice(words) for _ in range(n))

    systems = [text(args.system_words) for _ in range(args.systems)]
    out = []
    for cid in range(args.conversations):
        history = systems[cid % args.systems]
        turns = []
        for _ in range(args.turns):
            history += " " + text(args.user_words)
            turns.append(history)
            history += " " + text(args.assistant_words)  # the reply the client keeps
        out.append(Conversation(cid, turns))
    return out


class Target:
    def __init__(self, name: str, url: str, *, text: bool = False, policy: str | None = None):
        self.name, self.url, self.text, self.policy = name, url, text, policy


async def drive(
    target: Target,
    convs: list[Conversation],
    encode: Any,
    engines: list[str],
    clients: int,
) -> list[float]:
    """Every conversation, turns in order, ``clients`` conversations at a time."""
    queue: asyncio.Queue[Conversation] = asyncio.Queue()
    for c in convs:
        queue.put_nowait(c)
    latencies: list[float] = []
    headers = {"x-kvroute-policy": target.policy} if target.policy else None
    pinned = target.name == "pinning"
    http = httpx.AsyncClient(limits=httpx.Limits(max_connections=clients * 2), timeout=60)
    sdk: dict[str, openai.AsyncOpenAI] = {}

    def client(base: str) -> openai.AsyncOpenAI:
        if base not in sdk:
            sdk[base] = openai.AsyncOpenAI(
                base_url=f"{base}/v1", api_key="-", max_retries=0, http_client=http
            )
        return sdk[base]

    async def one_client() -> None:
        while not queue.empty():
            conv = queue.get_nowait()
            base = engines[zlib.crc32(b"%d" % conv.cid) % len(engines)] if pinned else target.url
            for prompt in conv.turns:
                t0 = time.perf_counter()
                await client(base).completions.create(
                    model=MODEL,
                    prompt=prompt if target.text else encode(prompt),
                    max_tokens=4,
                    extra_headers=headers,
                )
                latencies.append(time.perf_counter() - t0)

    try:
        await asyncio.gather(*(one_client() for _ in range(clients)))
    finally:
        await http.aclose()
    return latencies


async def probe(target: Target, engines: list[str], encode: Any, n: int) -> float:
    """Added p50 ms of this router: ``n`` sequential requests of one cached prompt,
    alternating router and engine 0 directly (same process state, no contention from the
    workload), median through the router minus median direct."""
    text = "kabe dodo " * 60
    prompt: Any = text if target.text else encode(text)
    headers = {"x-kvroute-policy": target.policy} if target.policy else {}
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 1}
    via, direct = [], []
    async with httpx.AsyncClient(timeout=30) as c:
        for i in range(n + 5):
            for url, out in ((target.url, via), (engines[0], direct)):
                t0 = time.perf_counter()
                r = await c.post(f"{url}/v1/completions", json=body, headers=headers)
                if i >= 5:  # warm-up: connections, the prompt cached everywhere
                    out.append(time.perf_counter() - t0)
                r.raise_for_status()
    return round(1000 * (statistics.median(via) - statistics.median(direct)), 3)


async def estimates(c: httpx.AsyncClient, kv: str) -> tuple[int, int, int]:
    """kvroute's own accounting: estimated hit tokens, engine-reported cached tokens,
    responses compared (summed over workers)."""
    workers = (await c.get(f"{kv}/v1/proxy/workers")).json()["workers"]
    return (
        sum(w["estimated_hit_tokens"] for w in workers),
        sum(w["cached_tokens"] for w in workers),
        sum(w["estimates_compared"] for w in workers),
    )


async def measure(
    c: httpx.AsyncClient,
    t: Target,
    kv: str,
    convs: list[Conversation],
    encode: Any,
    engines: list[str],
    args: argparse.Namespace,
) -> dict[str, Any]:
    """One target's run from clean caches: the engines' counts before and after."""
    await reset(c, engines, kv)
    before = await engine_stats(c, engines)
    est0 = await estimates(c, kv)
    lat = await drive(t, convs, encode, engines, args.clients)
    after = await engine_stats(c, engines)
    est1 = await estimates(c, kv)
    d = [
        {k: a[k] - b[k] for k in ("requests", "prompt_tokens", "cached_tokens")}
        for a, b in zip(after, before, strict=True)
    ]
    reqs = [x["requests"] for x in d]
    prompt = sum(x["prompt_tokens"] for x in d)
    est, cached, compared = (b - a for a, b in zip(est0, est1, strict=True))
    return {
        "hit_rate": round(sum(x["cached_tokens"] for x in d) / max(1, prompt), 4),
        "imbalance": round(max(reqs) / max(1e-9, statistics.mean(reqs)), 3),
        "requests_per_engine": reqs,
        "p50_ms": round(1000 * statistics.median(lat), 2),
        "p99_ms": round(1000 * pct(lat, 0.99), 2),
        "added_p50_ms": 0.0 if not t.url else await probe(t, engines, encode, 60),
        # kvroute's own accounting (docs/proxy.md): how close its estimates were
        "estimated_tokens": est,
        "cached_tokens": cached,
        "compared": compared,
    }


async def engine_stats(c: httpx.AsyncClient, engines: list[str]) -> list[dict[str, Any]]:
    return [(await c.get(f"{e}/stats")).json() for e in engines]


async def reset(c: httpx.AsyncClient, engines: list[str], router: str) -> None:
    for e in engines:
        for _ in range(50):
            r = await c.post(f"{e}/reset_prefix_cache")
            if r.status_code == 200:
                break
            await asyncio.sleep(0.1)
    await asyncio.sleep(0.5)  # the routers' views take the clear event


def start_peers(
    engines: list[str], pubs: list[int], replays: list[int], tmp: Path, procs: list
) -> list[Target]:
    targets = []
    vr = PEERS / "vllm-router/bin/vllm-router"
    if vr.exists():
        for policy in ("kv_aware", "cache_aware"):
            port, metrics = free_ports(2)
            extra: list[str] = ["--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics)]
            if policy == "kv_aware":
                for e, pub, rep in zip(engines, pubs, replays, strict=True):
                    extra += ["--kv-event-source", f"{e}=tcp://127.0.0.1:{pub}"]
                    extra += ["--kv-event-replay-source", f"{e}=tcp://127.0.0.1:{rep}"]
                extra += ["--kv-event-block-size", "16", "--kv-event-model", MODEL]
            procs.append(start([
                str(vr), "--host", "127.0.0.1", "--port", str(port), "--worker-urls", *engines,
                "--policy", policy, *extra,
            ], tmp / f"vllm-router-{policy}.log"))  # fmt: skip
            targets.append(Target(f"vllm-router {policy}", f"http://127.0.0.1:{port}"))
    else:
        print(f"vllm-router not installed ({vr}): skipped", file=sys.stderr)
    sr = PEERS / "sglang-router/bin/sglang-router"
    if sr.exists():
        port, metrics = free_ports(2)
        procs.append(start([
            str(sr), "launch", "--host", "127.0.0.1", "--port", str(port),
            "--worker-urls", *engines, "--policy", "cache_aware",
            "--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics),
        ], tmp / "sglang-router.log"))  # fmt: skip
        targets.append(Target("sglang-router cache_aware", f"http://127.0.0.1:{port}", text=True))
    else:
        print(f"sglang-router not installed ({sr}): skipped", file=sys.stderr)
    return targets


async def run(args: argparse.Namespace) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="kvroute-bench-reuse-"))
    procs: list[subprocess.Popen[bytes]] = []
    tok = Tokenizer.from_file(str(TOKENIZER / "tokenizer.json"))

    def encode(text: str) -> list[int]:
        return tok.encode(text).ids  # with BOS, as the engine encodes a completion

    convs = workload(args)
    try:
        n = args.engines
        ports = free_ports(3 * n + 1)
        engines, specs, pubs, replays = [], [], [], []
        for i in range(n):
            http, pub, rep = ports[3 * i : 3 * i + 3]
            procs.append(start([
                sys.executable, "-m", "router.cli", "engine", "--port", str(http),
                "--worker-id", f"e{i}", "--publish", f"tcp://127.0.0.1:{pub}",
                "--replay", f"tcp://127.0.0.1:{rep}", "--gpu-blocks", str(args.gpu_blocks),
                "--cpu-blocks", "0", "--tokenizer", str(TOKENIZER), "--log-level", "warning",
            ], tmp / f"e{i}.log"))  # fmt: skip
            engines.append(f"http://127.0.0.1:{http}")
            pubs.append(pub)
            replays.append(rep)
            specs.append(
                f"e{i}=tcp://127.0.0.1:{pub},replay=tcp://127.0.0.1:{rep},http={engines[-1]}"
            )
        kv = f"http://127.0.0.1:{ports[-1]}"

        def kvroute(port: int, log: str, weights: str | None = None) -> None:
            procs.append(start([
                sys.executable, "-m", "router.cli", "serve", "--port", str(port),
                "--tokenizer", str(TOKENIZER), "--log-level", "warning",
                *[a for s in specs for a in ("--worker", s)],
            ], tmp / log, {"KVROUTE_ROUTE_WEIGHTS": weights} if weights else None))  # fmt: skip

        # kv_aware (with the defaults, and with each --kvroute-weights) gets a router of its
        # own, as every peer does: the reference policies' placements would otherwise sit
        # in its fair-share window at the start of the next run (docs/proxy.md).
        kvroute(ports[-1], "router.log")
        dedicated: list[Target] = []
        for weights in [None, *args.kvroute_weights]:
            (port,) = free_ports(1)
            kvroute(port, f"router-{port}.log", weights)
            name = "kvroute kv_aware" + (f" {weights}" if weights else "")
            dedicated.append(Target(name, f"http://127.0.0.1:{port}"))
        for e in engines:
            await wait_http(f"{e}/health")
        targets = [
            dedicated[0],
            Target("kvroute longest_prefix", kv, policy="longest_prefix"),
            *dedicated[1:],
            Target("kvroute round_robin", kv, policy="round_robin"),
        ]
        targets += start_peers(engines, pubs, replays, tmp, procs)
        targets.append(Target("pinning", ""))
        for t in [Target("", kv), *dedicated]:
            await wait_live(t.url)
        skipped = {}
        for t in list(targets):
            if t.url and t.url != kv and t not in dedicated:
                try:
                    await wait_http(f"{t.url}/health", timeout=60)
                except RuntimeError as exc:  # its log is in tmp
                    print(f"{t.name} did not come up: skipped ({exc})", file=sys.stderr)
                    skipped[t.name] = str(exc)
                    targets.remove(t)
        runs: list[dict[str, Any]] = []
        async with httpx.AsyncClient(timeout=30) as c:
            for _ in range(args.runs):
                rows: dict[str, Any] = {}
                for t in targets:
                    router = t.url if t in dedicated else kv
                    rows[t.name] = await measure(c, t, router, convs, encode, engines, args)
                    if t.url != router and t.url != kv:  # kvroute's estimates: kvroute only
                        for k in ("estimated_tokens", "cached_tokens", "compared"):
                            rows[t.name].pop(k)
                    print(t.name, rows[t.name], file=sys.stderr, flush=True)
                runs.append(rows)
        return {
            "engines": n,
            "conversations": args.conversations,
            "turns": args.turns,
            "clients": args.clients,
            "requests": args.conversations * args.turns,
            "runs": runs,
            "skipped": skipped,
        }
    finally:
        stop_all(procs)


def table(result: dict[str, Any]) -> str:
    """Min-max over the runs, as docs/proxy.md prints them."""

    def rng(name: str, key: str, fmt: str) -> str:
        vals = [run[name][key] for run in result["runs"] if name in run]
        lo, hi = format(min(vals), fmt), format(max(vals), fmt)
        return lo if lo == hi else f"{lo}-{hi}"

    lines = [
        f"min-max over {len(result['runs'])} runs",
        "| target | hit rate | imbalance | added p50 ms |",
        "|---|---|---|---|",
    ]
    for name in result["runs"][0]:
        lines.append(
            f"| {name} | {rng(name, 'hit_rate', '.3f')} | {rng(name, 'imbalance', '.2f')} | "
            f"{rng(name, 'added_p50_ms', '.2f')} |"
        )
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--engines", type=int, default=4)
    p.add_argument("--gpu-blocks", type=int, default=512, help="per engine, 16 tokens each")
    p.add_argument("--conversations", type=int, default=48)
    p.add_argument("--turns", type=int, default=6)
    p.add_argument("--clients", type=int, default=8, help="concurrent openai clients")
    p.add_argument("--systems", type=int, default=4, help="shared system prompts")
    p.add_argument("--system-words", type=int, default=200)
    p.add_argument("--user-words", type=int, default=60)
    p.add_argument("--assistant-words", type=int, default=40)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--runs", type=int, default=3, help="repeats over the same processes")
    p.add_argument(
        "--kvroute-weights",
        action="append",
        default=[],
        help="also a kvroute with these kv_aware weights (JSON, e.g. '{\"decode\": 128}')",
    )
    p.add_argument("--json", default=None)
    args = p.parse_args()
    result = asyncio.run(run(args))
    report(result, table(result), args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
