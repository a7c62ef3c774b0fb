"""Decode throughput: ``schemas.decode_batch`` vs a plain typed msgspec decode.

The safe decoder's promise is that tolerance costs (almost) nothing on the common path:
it must stay within 0.9x of ``msgspec.msgpack.Decoder(KVEventBatch).decode`` on what a
live vLLM fleet sends. The workload mimics scheduler steps of a hybrid model: each batch
stores 1-32 blocks of 16 tokens in two groups (full attention + sliding window) and
removes a few evicted blocks, with int hashes.

Run: ``python benchmarks/wire.py [--batches N] [--repeat R] [--json]``.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections.abc import Callable

import msgspec

from schemas import (
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    decode_batch,
    encode_batch,
)

BLOCK_SIZE = 16
GROUPS = ((0, "full_attention", None), (1, "sliding_window", 1024))


def make_payloads(n_batches: int, seed: int = 0) -> tuple[list[bytes], int]:
    """Build ``n_batches`` vLLM-format payloads; return them and their block count."""
    rng = random.Random(seed)
    payloads: list[bytes] = []
    blocks = 0
    for i in range(n_batches):
        events: list[BlockStored | BlockRemoved] = []
        n_blocks = rng.randint(1, 32)
        hashes = [rng.getrandbits(64) for _ in range(n_blocks)]
        parent = rng.getrandbits(64) if rng.random() < 0.5 else None
        tokens = [rng.randrange(150_000) for _ in range(n_blocks * BLOCK_SIZE)]
        for group_idx, kind, window in GROUPS:
            events.append(
                BlockStored(
                    block_hashes=hashes,
                    parent_block_hash=parent,
                    token_ids=tokens,
                    block_size=BLOCK_SIZE,
                    lora_id=None,
                    medium="GPU",
                    lora_name=None,
                    group_idx=group_idx,
                    kv_cache_spec_kind=kind,
                    kv_cache_spec_sliding_window=window,
                )
            )
            blocks += n_blocks
        if rng.random() < 0.6:
            for group_idx, _, _ in GROUPS:
                removed = [rng.getrandbits(64) for _ in range(rng.randint(1, 8))]
                events.append(BlockRemoved(block_hashes=removed, medium="GPU", group_idx=group_idx))
                blocks += len(removed)
        payloads.append(encode_batch(KVEventBatch(ts=1.7e9 + i, events=events)))
    return payloads, blocks


def _time(fn: Callable[[bytes], object], payloads: list[bytes], repeat: int) -> float:
    """Best-of-``repeat`` seconds for decoding every payload once."""
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        for p in payloads:
            fn(p)
        best = min(best, time.perf_counter() - start)
    return best


def run(n_batches: int, repeat: int) -> dict[str, object]:
    payloads, blocks = make_payloads(n_batches)
    plain = msgspec.msgpack.Decoder(KVEventBatch).decode
    if decode_batch(payloads[0]) != plain(payloads[0]):
        raise SystemExit("decoders disagree on the workload")
    # Interleave the two measurements so machine noise hits both alike.
    t_plain = t_safe = float("inf")
    for _ in range(repeat):
        t_plain = min(t_plain, _time(plain, payloads, 1))
        t_safe = min(t_safe, _time(decode_batch, payloads, 1))
    rows = {
        "plain_typed": {"batches_per_s": n_batches / t_plain, "blocks_per_s": blocks / t_plain},
        "decode_batch": {"batches_per_s": n_batches / t_safe, "blocks_per_s": blocks / t_safe},
    }
    return {
        "batches": n_batches,
        "blocks": blocks,
        "payload_bytes_mean": sum(map(len, payloads)) / n_batches,
        "results": rows,
        "ratio": t_plain / t_safe,
        "target_ratio": 0.9,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, default=5_000)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--json", action="store_true", help="print the result as JSON")
    args = ap.parse_args(argv)
    res = run(args.batches, args.repeat)
    if args.json:
        print(json.dumps(res, indent=2))
        return 0
    print(
        f"{res['batches']} batches, {res['blocks']} blocks, "
        f"{res['payload_bytes_mean']:.0f} B/batch on average"
    )
    print(f"{'decoder':<14} {'batches/s':>12} {'blocks/s':>14}")
    for name, row in res["results"].items():  # type: ignore[union-attr]
        print(f"{name:<14} {row['batches_per_s']:>12,.0f} {row['blocks_per_s']:>14,.0f}")
    print(f"ratio decode_batch / plain_typed: {res['ratio']:.3f} (target >= 0.9)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
