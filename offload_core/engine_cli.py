"""``kvroute engine``: the command line of the simulated engine worker.

Its own module so that the engine (``offload_core.engine``) and its HTTP layer
(``offload_core.engine_app``, which imports the engine) never import each other: this
module imports both.
"""

from __future__ import annotations

import argparse
import logging
import sys

from offload_core.engine import EngineConfig
from offload_core.engine_app import run_server
from offload_core.engine_context import DEFAULT_MAX_MODEL_LEN
from offload_core.groups import parse_groups
from offload_core.vcache import VKVCacheManager
from publisher import PUBLISH_MODES
from schemas.hashing import HASH_ALGOS


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="kvroute engine",
        description="Run a simulated engine worker that serves /v1/completions and "
        "publishes vLLM-format KV events (prefix caching, hybrid groups, CPU offload).",
    )
    add = p.add_argument
    add("--host", default="127.0.0.1", help="HTTP bind address (default loopback only)")
    add("--port", type=int, default=8100, help="HTTP port for /v1/completions")
    add("--worker-id", default="engine-0", help="worker id, also the default topic suffix")
    add(
        "--publish",
        default="tcp://127.0.0.1:5557",
        help="KV event PUB endpoint (default loopback only; '' disables)",
    )
    add(
        "--publish-mode",
        choices=PUBLISH_MODES,
        default="bind",
        help="bind the PUB endpoint (default), connect to it (a router or proxy that "
        "binds), or auto: vLLM's rule (a wildcard host, ::, ipc or inproc binds, a concrete "
        "host connects)",
    )
    add(
        "--replay",
        default="tcp://127.0.0.1:5558",
        help="replay ROUTER endpoint, always bound (default loopback only; '' disables)",
    )
    add("--topic", default=None, help="ZMQ topic (default kv@<worker-id>)")
    add("--gpu-blocks", type=int, default=1024, help="GPU pool size (block 0 is the null block)")
    add("--cpu-blocks", type=int, default=4096, help="CPU offload blocks; 0 disables offloading")
    add(
        "--cpu-store-threshold",
        type=int,
        default=0,
        help="vLLM's store_threshold: offload a block only from its N-th offer (< 2: always)",
    )
    add(
        "--groups",
        default="full:16",
        help="KV cache groups in group order, KIND:BLOCK_SIZE[:WINDOW] (kinds full, mla, "
        "swa, mamba; block sizes may differ), e.g. full:16,swa:16:1024 or mla:256,swa:64:128",
    )
    add(
        "--hash-block-size",
        type=int,
        default=None,
        help="token granularity of block hashes (vLLM's hash_block_size); must divide every "
        "block size; default: the block size (one group) or the gcd of the block sizes",
    )
    add(
        "--eagle",
        action="store_true",
        help="EAGLE/MTP speculative decoding: hits drop the last matched block, as vLLM does",
    )
    add(
        "--retention-interval",
        type=int,
        default=None,
        help="vLLM's prefix_cache_retention_interval: keep sliding-window tails / mamba "
        "states once per this many tokens (a multiple of the lcm of the block sizes; 0 = "
        "only the replay boundary); default: dense",
    )
    add(
        "--hash",
        dest="hash_algo",
        choices=HASH_ALGOS,
        default="sha256",
        help="block hash algorithm (as vLLM's --prefix-caching-hash-algo)",
    )
    add("--cpu-policy", choices=("lru", "arc"), default="lru", help="CPU tier eviction policy")
    add("--num-heads", type=int, default=2, help="KV heads of the simulated model")
    add("--head-dim", type=int, default=8, help="head dimension of the simulated model")
    add("--device", default=None, help="torch device (default: cuda if present)")
    add(
        "--log-level",
        default="info",
        choices=("debug", "info", "warning", "error"),
        help="log level",
    )
    # The OpenAI API (offload_core/engine_app.py): text prompts and chat need a tokenizer.
    add("--tokenizer", default=None, help="dir with tokenizer.json (text, chat)")
    add("--served-model-name", default=None, help="its model (default kvroute-sim, any name ok)")
    add(
        "--lora-modules",
        nargs="+",
        default=[],
        metavar="NAME[=PATH]",
        help="LoRA adapters served by name as vLLM's flag lists them (the path is ignored)",
    )
    add(
        "--max-model-len",
        type=_positive_int,
        default=DEFAULT_MAX_MODEL_LEN,
        help="the context in tokens, listed in /v1/models and enforced as vLLM does",
    )
    add("--token-delay-ms", type=float, default=0.0, help="simulated decode step")
    add(
        "--prefill-us-per-token",
        type=float,
        default=0.0,
        help="simulated prefill time per uncached prompt token (one prefill at a time)",
    )
    return p


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    config = EngineConfig(
        worker_id=args.worker_id,
        groups=args.groups,
        gpu_blocks=args.gpu_blocks,
        cpu_blocks=args.cpu_blocks,
        hash_algo=args.hash_algo,
        cpu_policy=args.cpu_policy,
        cpu_store_threshold=args.cpu_store_threshold,
        num_heads=args.num_heads,
        head_dim=args.head_dim,
        device=args.device,
        hash_block_size=args.hash_block_size,
        eagle=args.eagle,
        retention_interval=args.retention_interval,
    )
    topic = args.topic if args.topic is not None else f"kv@{args.worker_id}"
    try:
        VKVCacheManager(
            parse_groups(config.groups),
            max(config.gpu_blocks, 2),
            hash_block_size=config.hash_block_size,
            eagle=config.eagle,
            retention_interval=config.retention_interval,
            enable_events=False,
        )
    except ValueError as exc:
        print(f"kvroute engine: {exc}", file=sys.stderr)
        return 2
    return run_server(
        config,
        args.host,
        args.port,
        args.publish,
        args.replay or None,
        topic,
        tokenizer=args.tokenizer,
        model=args.served_model_name,
        token_delay_s=args.token_delay_ms / 1000,
        publish_mode=args.publish_mode,
        prefill_s_per_token=args.prefill_us_per_token / 1e6,
        lora_modules=[m.partition("=")[0] for m in args.lora_modules],
        max_model_len=args.max_model_len,
    )
