"""Record vLLM 0.33's own ``KVCacheManager`` serving ``shapes.requests()`` one request at
a time, exactly as ``offload_core.vsched.serve_request`` drives ours (prefill chunked by
vLLM's own ``Scheduler._mamba_block_aligned_split``, decode, free): per request the hit
(``num_computed_tokens`` from ``get_computed_blocks``) and the event batch encoded as
vLLM's ``ZmqEventPublisher`` does. Run in a venv with vLLM installed:

    /work/venv-vllm/bin/python tests/offload_core/parity/record_vllm.py

Writes tests/fixtures/engine-parity/<shape>.msgpack (captured from vLLM 0.33.0's own
code, Apache-2.0). ``make test`` replays them without vLLM.
"""

from __future__ import annotations

import math
import sys
import zlib
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import msgspec
import torch
from vllm.distributed.kv_events import KVEventBatch
from vllm.lora.request import LoRARequest
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    MambaSpec,
    MLAAttentionSpec,
    SlidingWindowSpec,
)
from vllm.v1.request import Request

sys.path.insert(0, str(Path(__file__).parent))
from shapes import SHAPES, requests

OUT = Path(__file__).resolve().parents[2] / "fixtures" / "engine-parity"


def spec(item: str) -> Any:
    kind, *rest = item.split(":")
    b = int(rest[0])
    common = {"block_size": b, "num_kv_heads": 1, "head_size": 8, "dtype": torch.float16}
    if kind == "full":
        return FullAttentionSpec(**common)
    if kind == "mla":
        return MLAAttentionSpec(**common)
    if kind == "swa":
        return SlidingWindowSpec(**common, sliding_window=int(rest[1]))
    if kind == "mamba":
        return MambaSpec(
            block_size=b, shapes=((4,),), dtypes=(torch.float16,), mamba_cache_mode="align"
        )
    raise ValueError(item)


def next_token(tokens: list[int]) -> int:
    return (len(tokens) * 7919 + sum(tokens[-4:])) % 32000


def record(name: str) -> dict[str, Any]:
    groups, num_blocks, hash_bs, eagle, retention = SHAPES[name]
    specs = [spec(i) for i in groups.split(",")]
    sizes = [s.block_size for s in specs]
    step = math.lcm(*sizes)
    hb = hash_bs or (sizes[0] if len(sizes) == 1 else math.gcd(*sizes))
    cfg = KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec([f"l{i}"], s) for i, s in enumerate(specs)],
        prefix_cache_retention_interval=retention,
    )
    mgr = KVCacheManager(
        cfg,
        max_model_len=1 << 20,
        scheduler_block_size=step,
        hash_block_size=hb,
        use_eagle=eagle,
        enable_kv_cache_events=True,
    )
    mamba = [s.block_size for s in specs if isinstance(s, MambaSpec)]
    fake = SimpleNamespace(
        cache_config=SimpleNamespace(block_size=mamba[0] if mamba else step),
        hash_block_size=hb,
        mamba_partial_cache_hit=bool(mamba)
        and hb < mamba[0]
        and mgr.coordinator.enable_partial_hash_hits,
        use_eagle_block_drop=eagle,
        num_hash_lookahead_tokens=0,
        mamba_has_prefill_checkpoint_blocks=False,
        mamba_prefill_checkpoint_alignment=None,
        max_num_scheduled_tokens=1 << 20,
        scheduler_config=SimpleNamespace(long_prefill_token_threshold=0),
        mamba_shared_prefix_checkpoint=False,
    )
    hasher = get_request_block_hasher(hb, sha256)
    enc = msgspec.msgpack.Encoder()
    cases = []
    for i, r in enumerate(requests()):
        lora = None
        if r["lora_name"]:
            lid = (zlib.crc32(r["lora_name"].encode()) & 0x7FFFFFFF) or 1
            lora = LoRARequest(r["lora_name"], lid, f"lora://{r['lora_name']}")
        req = Request(
            f"req-{i + 1}",
            list(r["token_ids"]),
            SamplingParams(max_tokens=r["max_tokens"]),
            None,
            lora_request=lora,
            cache_salt=r["cache_salt"],
            block_hasher=hasher,
        )
        blocks, local, boundary = mgr.get_computed_blocks(req)
        req.shared_prefix_boundary = boundary
        first, generated, ok = True, 0, True
        while True:
            mgr.new_step_starts()
            start = local if first else req.num_computed_tokens
            num_new = req.num_tokens - start
            if mamba:
                num_new = Scheduler._mamba_block_aligned_split(
                    fake, req, num_new, local if first else 0, 0
                )
            got = mgr.allocate_slots(req, num_new, local if first else 0, blocks if first else None)
            if got is None:
                ok = False
                break
            _, retained = mgr.take_kv_cache_block_copies()
            req.num_computed_tokens = start + num_new
            mgr.block_pool.free_blocks(retained)
            first = False
            if req.num_computed_tokens < req.num_tokens:
                continue
            generated += 1
            if generated >= r["max_tokens"]:
                break
            req.append_output_token_ids(next_token(req.all_token_ids))
        mgr.free(req)
        batch = KVEventBatch(ts=0.0, events=mgr.take_events())
        cases.append({"hit": local, "ok": ok, "events": enc.encode(batch)})
    return {
        "vllm_version": "0.33.0",
        "shape": name,
        "groups": groups,
        "num_blocks": num_blocks,
        "hash_block_size": hash_bs,
        "eagle": eagle,
        "retention_interval": retention,
        "cases": cases,
    }


def main() -> None:
    init_none_hash(sha256)
    OUT.mkdir(parents=True, exist_ok=True)
    for name in sys.argv[1:] or SHAPES:
        data = record(name)
        (OUT / f"{name}.msgpack").write_bytes(msgspec.msgpack.encode(data))
        hits = [c["hit"] for c in data["cases"]]
        print(name, "requests", len(hits), "hit>0", sum(h > 0 for h in hits))


if __name__ == "__main__":
    main()
