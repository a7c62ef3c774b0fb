"""The router against vLLM 0.33's own KVCacheManager, on memory and Redis.

Replays the recordings of ``tests/fixtures/engine-parity`` (captured from vLLM's real
``v1/core`` by ``tests/offload_core/parity/record_vllm.py``): before each request the
router's ``hit_tokens`` must equal what vLLM's ``get_computed_blocks`` found, then the
request's event batch -- exactly as vLLM's publisher encoded it -- is ingested. Every
shape: full attention, sliding windows wider and narrower than the alignment, mamba in
align mode (partial-hash hits), MLA 256 + SWA 64 at a 64-token hash unit, EAGLE, and a
retention interval. No event may be rejected.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

import msgspec
import pytest
from _kv_streams import Harness

from router.index.base import EngineSettings
from schemas import decode_batch

PARITY = Path(__file__).resolve().parents[2] / "offload_core" / "parity"
sys.path.insert(0, str(PARITY))
from shapes import SHAPES, requests  # noqa: E402

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "engine-parity"


def settings(data: dict[str, Any]) -> EngineSettings:
    """What an operator registers for this engine (vLLM's defaults otherwise)."""
    sizes = [int(item.split(":")[1]) for item in data["groups"].split(",")]
    unit = data["hash_block_size"] or math.gcd(*sizes)
    # vLLM enables partial-hash hits when a mamba (align) group's block exceeds the unit.
    partial = any(
        item.startswith("mamba:") and int(item.split(":")[1]) > unit
        for item in data["groups"].split(",")
    )
    return EngineSettings(data["hash_block_size"], data["eagle"], partial)


@pytest.mark.parametrize("shape", list(SHAPES))
async def test_every_probe_is_exact_and_no_event_rejected(harness: Harness, shape: str) -> None:
    data = msgspec.msgpack.decode((FIXTURES / f"{shape}.msgpack").read_bytes())
    await harness.ingestor.configure("w", settings(data))
    wrong = []
    for i, (req, case) in enumerate(zip(requests(), data["cases"], strict=True)):
        got = await harness.one(
            req["token_ids"], "w", lora_name=req["lora_name"], cache_salt=req["cache_salt"]
        )
        if got.hit_tokens != case["hit"]:
            wrong.append((i, got.hit_tokens, case["hit"]))
        await harness.ingestor.apply_batch("w", decode_batch(case["events"]))
    assert wrong == [], f"{len(wrong)} of {len(data['cases'])} probes differ: {wrong[:5]}"
    c = harness.ingestor.counters
    rejected = (c.bad_events, c.bad_groups, c.unknown_parent, c.unresolved_blocks)
    assert (*rejected, c.unplaced_blocks, c.events_unknown) == (0,) * 6
