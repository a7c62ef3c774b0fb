"""Engine-side throughput: hashing, simulated requests, KV transfers.

* hashing -- blocks/s of ``schemas.hashing.block_hashes`` (vLLM-identical: pickle or
  CBOR of ``(parent, tokens, extra)`` then sha256) vs a plain loop that sha256-hashes each
  block's raw token bytes chained with its parent (the floor any prefix hash pays);
* engine -- requests/s of the cache model alone (``KVCacheManager.process``, no torch),
  of ``SimEngine.serve`` in process (hash, hit, offload, load back, KV writes, events),
  and over HTTP (uvicorn + httpx, one request at a time);
* transfer -- GB/s of the batched store (device -> CPU) and load (CPU -> device) of a
  scattered block set, on this machine's engine device, against one contiguous copy of the
  same bytes (pinned host memory on CUDA): the floor a gather/scatter of blocks pays.

Run: ``python benchmarks/engine.py [--json] [--requests N] [--transfer-blocks B]``.
"""

from __future__ import annotations

import argparse
import array
import hashlib
import json
import random
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx
import torch
import uvicorn

from offload_core.base import ReqContext, make_offload_key
from offload_core.cpu import CPUOffloadingManager
from offload_core.engine import EngineConfig, SimEngine
from offload_core.engine_app import create_app
from offload_core.groups import parse_groups
from offload_core.kv_cache import KVCacheManager
from offload_core.transfer import KVBuffers, TransferWorker
from schemas.hashing import block_hashes

BLOCK = 16


def best_of(repeat: int, fn: Callable[[], None]) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


# ------------------------------------------------------------------------ hashing
def bench_hashing(tokens: int, repeat: int) -> dict[str, Any]:
    rng = random.Random(0)
    ids = [rng.randrange(150_000) for _ in range(tokens)]
    n_blocks = tokens // BLOCK

    def plain() -> None:
        raw = array.array("I", ids).tobytes()
        parent = b"\0" * 32
        for i in range(n_blocks):
            parent = hashlib.sha256(parent + raw[i * BLOCK * 4 : (i + 1) * BLOCK * 4]).digest()

    out: dict[str, Any] = {"blocks": n_blocks}
    t_plain = best_of(repeat, plain)
    out["plain_hashlib_blocks_per_s"] = n_blocks / t_plain
    for algo in ("sha256", "sha256_cbor"):
        t = best_of(repeat, lambda a=algo: block_hashes(ids, BLOCK, a))
        out[f"{algo}_blocks_per_s"] = n_blocks / t
        out[f"{algo}_vs_plain"] = t_plain / t
    return out


# ------------------------------------------------------------------------ engine
def workload(n: int, prompt_tokens: int, seed: int = 0) -> list[list[int]]:
    """Chat-like prompts: 8 shared system prompts (half the prompt) + a unique tail."""
    rng = random.Random(seed)
    half = prompt_tokens // 2
    systems = [[rng.randrange(150_000) for _ in range(half)] for _ in range(8)]
    return [
        rng.choice(systems) + [rng.randrange(150_000) for _ in range(prompt_tokens - half)]
        for _ in range(n)
    ]


def bench_engine(requests: int, prompt_tokens: int, groups: str) -> dict[str, Any]:
    prompts = workload(requests, prompt_tokens)
    per_req = -(-prompt_tokens // BLOCK) * len(parse_groups(groups))
    gpu_blocks = per_req * 6  # pressure: about 6 prompts fit, so blocks get evicted
    out: dict[str, Any] = {"groups": groups, "prompt_tokens": prompt_tokens}

    kv = KVCacheManager(parse_groups(groups), gpu_blocks)
    t0 = time.perf_counter()
    for p in prompts:
        kv.process(p)
    out["cache_model_req_per_s"] = requests / (time.perf_counter() - t0)

    cfg = EngineConfig(groups=groups, gpu_blocks=gpu_blocks, cpu_blocks=gpu_blocks * 2)
    engine = SimEngine(cfg)
    t0 = time.perf_counter()
    for p in prompts:
        engine.serve(p)
    out["engine_req_per_s"] = requests / (time.perf_counter() - t0)
    s = engine.stats
    out["hit_rate"] = s.cached_tokens / s.prompt_tokens
    out["offloaded_blocks"] = s.offloaded_blocks
    out["loaded_blocks"] = s.loaded_blocks

    engine = SimEngine(cfg)
    server = uvicorn.Server(
        uvicorn.Config(create_app(engine), host="127.0.0.1", port=0, log_level="warning")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as client:
        client.get("/health")
        t0 = time.perf_counter()
        for p in prompts:
            client.post("/v1/completions", json={"prompt": p}).raise_for_status()
        out["http_req_per_s"] = requests / (time.perf_counter() - t0)
    server.should_exit = True
    thread.join(10)
    return out


# ---------------------------------------------------------------------- transfer
def bench_transfer(
    blocks: int,
    heads: int,
    head_dim: int,
    repeat: int,
    device: str | None,
    direct_run_bytes: int | None = None,
) -> dict[str, Any]:
    groups = parse_groups("full:16")
    buffers = KVBuffers(
        groups, blocks * 2, blocks, heads, head_dim, dtype=torch.bfloat16, device=device
    )
    buffers.gpu[0].normal_()
    manager = CPUOffloadingManager(blocks)
    worker = TransferWorker(buffers, manager)
    if direct_run_bytes is not None:  # a huge value forces the gather/scatter path
        worker.direct_run_bytes = direct_run_bytes
    ctx = ReqContext()
    rng = random.Random(0)
    gpu_ids = rng.sample(range(blocks * 2), blocks)  # scattered, as in a real pool
    nbytes = blocks * buffers.block_bytes(0)
    rounds = iter(range(1_000_000))
    keys: list = []

    def store() -> None:
        # Fresh keys each round: the manager evicts the previous set (LRU) to make room.
        r = next(rounds)
        keys[:] = [make_offload_key(r.to_bytes(16, "big") + i.to_bytes(16, "big"), 0)
                   for i in range(blocks)]  # fmt: skip
        out = manager.prepare_store(keys, ctx)
        assert out is not None
        worker.store(out.keys_to_store, gpu_ids, out.store_spec, ctx)
        worker.wait()

    t_store = best_of(repeat, store)
    expected = buffers.gpu[0][gpu_ids].cpu()
    load_ids = rng.sample(range(blocks * 2), blocks)

    def load() -> None:
        spec = manager.prepare_load(keys, ctx)
        worker.load(keys, spec, load_ids, ctx)
        worker.wait()

    t_load = best_of(repeat, load)
    ok = torch.equal(buffers.gpu[0][load_ids].cpu(), expected)

    # The peer: one contiguous copy of the same bytes between the device and host memory
    # of the same kind (pinned on CUDA), the floor any block gather/scatter pays.
    src = buffers.gpu[0][:blocks]
    host = torch.empty(src.shape, dtype=src.dtype, pin_memory=buffers.device.type == "cuda")

    def sync() -> None:
        if buffers.device.type == "cuda":
            torch.cuda.synchronize(buffers.device)

    def copy_out() -> None:
        host.copy_(src, non_blocking=True)
        sync()

    def copy_in() -> None:
        src.copy_(host, non_blocking=True)
        sync()

    t_copy_out = best_of(repeat, copy_out)
    t_copy_in = best_of(repeat, copy_in)
    return {
        "device": str(buffers.device),
        "blocks": blocks,
        "block_bytes": buffers.block_bytes(0),
        "store_gb_per_s": nbytes / t_store / 1e9,
        "load_gb_per_s": nbytes / t_load / 1e9,
        "copy_out_gb_per_s": nbytes / t_copy_out / 1e9,
        "copy_in_gb_per_s": nbytes / t_copy_in / 1e9,
        "store_vs_copy": t_copy_out / t_store,
        "load_vs_copy": t_copy_in / t_load,
        "round_trip_exact": ok,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--hash-tokens", type=int, default=64 * 1024)
    ap.add_argument("--requests", type=int, default=500)
    ap.add_argument("--prompt-tokens", type=int, default=1024)
    ap.add_argument("--groups", default="full:16,swa:16:256")
    ap.add_argument("--transfer-blocks", type=int, default=1024)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--device", default=None)
    ap.add_argument(
        "--direct-run-bytes",
        type=int,
        default=None,
        help="TransferWorker.direct_run_bytes (1e18: always gather + scatter)",
    )
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args(argv)
    torch.set_num_threads(max(1, torch.get_num_threads()))
    result = {
        "hashing": bench_hashing(args.hash_tokens, args.repeat),
        "engine": bench_engine(args.requests, args.prompt_tokens, args.groups),
        "transfer": bench_transfer(
            args.transfer_blocks,
            args.heads,
            args.head_dim,
            args.repeat,
            args.device,
            args.direct_run_bytes,
        ),
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    h, e, t = result["hashing"], result["engine"], result["transfer"]
    rows = [
        ("hashing", "plain hashlib loop (blocks/s)", f"{h['plain_hashlib_blocks_per_s']:,.0f}"),
        ("hashing", "block_hashes sha256 (blocks/s)", f"{h['sha256_blocks_per_s']:,.0f}"),
        ("hashing", "  vs plain", f"{h['sha256_vs_plain']:.2f}x"),
        ("hashing", "block_hashes sha256_cbor (blocks/s)", f"{h['sha256_cbor_blocks_per_s']:,.0f}"),
        ("hashing", "  vs plain", f"{h['sha256_cbor_vs_plain']:.2f}x"),
        ("engine", f"cache model only, {e['groups']} (req/s)",
         f"{e['cache_model_req_per_s']:,.0f}"),
        ("engine", "SimEngine.serve in process (req/s)", f"{e['engine_req_per_s']:,.0f}"),
        ("engine", "over HTTP, sequential (req/s)", f"{e['http_req_per_s']:,.0f}"),
        ("engine", "token hit rate / offloaded / loaded blocks",
         f"{e['hit_rate']:.2f} / {e['offloaded_blocks']} / {e['loaded_blocks']}"),
        ("transfer", f"store {t['blocks']} x {t['block_bytes'] // 1024} KiB, {t['device']} (GB/s)",
         f"{t['store_gb_per_s']:.2f}"),
        ("transfer", "  vs one contiguous copy", f"{t['store_vs_copy']:.2f}x"),
        ("transfer", "load (GB/s)", f"{t['load_gb_per_s']:.2f}"),
        ("transfer", "  vs one contiguous copy", f"{t['load_vs_copy']:.2f}x"),
        ("transfer", "round trip exact", str(t["round_trip_exact"])),
    ]  # fmt: skip
    width = max(len(r[1]) for r in rows)
    print(f"{'area':<9} {'measure':<{width}}  value")
    for area, what, value in rows:
        print(f"{area:<9} {what:<{width}}  {value}")
    print(f"({args.requests} prompts of {args.prompt_tokens} tokens)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
