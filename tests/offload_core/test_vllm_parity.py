"""The simulated engine against vLLM 0.33's own KVCacheManager: the same requests give
the same hit per request and the same published events, field by field.

The recordings (tests/fixtures/engine-parity/*.msgpack) were captured by
``tests/offload_core/parity/record_vllm.py`` from vLLM's real code; this replays them
without vLLM installed."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import msgspec
import pytest

from offload_core.engine import EngineConfig, RequestTooLargeError, SimEngine
from publisher import EventPublisher
from schemas import KVEvent, KVEventBatch, decode_batch

sys.path.insert(0, str(Path(__file__).parent / "parity"))
from shapes import SHAPES, requests

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "engine-parity"


class Capture(EventPublisher):
    def __init__(self) -> None:
        super().__init__()
        self.batches: list[KVEventBatch] = []

    def publish(self, batch: KVEventBatch) -> None:
        self.batches.append(batch)

    def shutdown(self, timeout: float = 1.0) -> None:
        return


def as_dicts(events: list[KVEvent]) -> list[dict[str, Any]]:
    return [{"type": type(e).__name__, **msgspec.structs.asdict(e)} for e in events]


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_engine_matches_vllm_request_by_request(shape: str) -> None:
    rec = msgspec.msgpack.decode((FIXTURES / f"{shape}.msgpack").read_bytes())
    groups, num_blocks, hash_bs, eagle, retention = SHAPES[shape]
    cap = Capture()
    cfg = EngineConfig(
        groups=groups,
        gpu_blocks=num_blocks,
        cpu_blocks=0,
        device="cpu",
        hash_block_size=hash_bs,
        eagle=eagle,
        retention_interval=retention,
    )
    engine = SimEngine(cfg, cap)
    mismatched: list[str] = []
    for i, (req, case) in enumerate(zip(requests(), rec["cases"], strict=True)):
        before = len(cap.batches)
        try:
            res = engine.serve(
                req["token_ids"], req["cache_salt"], req["lora_name"], req["max_tokens"]
            )
            hit, ok = res.cached_tokens, True
        except RequestTooLargeError:
            hit, ok = -1, False
        ours = [e for b in cap.batches[before:] for e in b.events]
        theirs = decode_batch(case["events"]).events
        if ok != case["ok"] or (ok and hit != case["hit"]):
            mismatched.append(f"request {i}: hit {hit} (ok={ok}) vs vLLM {case['hit']}")
        elif as_dicts(ours) != as_dicts(theirs):
            mismatched.append(
                f"request {i}: events differ\n ours  {as_dicts(ours)}\n vllm {as_dicts(theirs)}"
            )
    engine.shutdown()
    assert not mismatched, f"{len(mismatched)}/{len(rec['cases'])} differ:\n" + "\n".join(
        mismatched[:3]
    )


@pytest.mark.parametrize("shape", sorted(s for s in SHAPES if s not in ("full_mamba",)))
def test_hit_rule_over_vllm_events_predicts_vllm_hits(shape: str) -> None:
    """``hit_rule.longest_hit`` (the router's rule, with ``eagle``/``alignment``) over the
    state rebuilt from vLLM's own events predicts vLLM's hit for every request.
    (full_mamba has sub-block partial-hash hits, which block masks cannot express.)"""
    from collections import Counter

    from offload_core.groups import parse_groups
    from schemas import AllBlocksCleared, BlockStored
    from schemas.hashing import block_hashes, external_hash
    from schemas.hit_rule import hit_step, longest_hit

    rec = msgspec.msgpack.decode((FIXTURES / f"{shape}.msgpack").read_bytes())
    groups_text, _, hash_bs, eagle, _ = SHAPES[shape]
    groups = parse_groups(groups_text)
    unit = hash_bs or (
        groups[0].block_size if len(groups) == 1 else min(g.block_size for g in groups)
    )
    state: Counter[tuple[int, int]] = Counter()
    wrong = []
    for i, (req, case) in enumerate(zip(requests(), rec["cases"], strict=True)):
        lora = (
            None if req["lora_name"] is None else (req["lora_name"], f"lora://{req['lora_name']}")
        )
        chain = block_hashes(req["token_ids"], unit, "sha256", req["cache_salt"], lora)
        masks = []
        for g, spec in enumerate(groups):
            scale = spec.block_size // unit
            masks.append([state[(g, external_hash(d))] > 0 for d in chain[scale - 1 :: scale]])
        got = longest_hit(
            len(req["token_ids"]),
            groups,
            masks,
            eagle=eagle,
            alignment=hit_step(groups),
            hash_block_size=unit,
        )
        if got != case["hit"]:
            wrong.append(f"request {i}: rule {got} vs vLLM {case['hit']}")
        for ev in decode_batch(case["events"]).events:
            if isinstance(ev, AllBlocksCleared):
                state.clear()
                continue
            for h in ev.block_hashes:
                state[(ev.group_idx or 0, h)] += 1 if isinstance(ev, BlockStored) else -1
    assert not wrong, "\n".join(wrong[:5])
