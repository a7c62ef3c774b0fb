"""SGLang's wire forms, from golden bytes its own structs encoded.

``tests/fixtures/sglang-0.5/wire/<version>.msgpack`` were written by
``conformance/sglang/sglang_wire_golden.py`` from each version's ``kv_events.py``:
0.5.2 (positional, trailing defaults omitted), 0.5.17 (positional with ``medium``),
0.5.19 (a salted store appends a ``{"cache_salt"}`` metadata map where vLLM's positional
form has ``lora_name``), 0.5.20 / 0.5.23 (tagged maps leaving out every None field).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest

from schemas import (
    BlockStored,
    DecodeStats,
    KVEventBatch,
    decode_batch,
    encode_batch,
    normalise_medium,
)

WIRE = Path(__file__).resolve().parents[1] / "fixtures" / "sglang-0.5" / "wire"
VERSIONS = ("0.5.2", "0.5.17", "0.5.19", "0.5.20", "0.5.23")


def _cases() -> list[tuple[str, dict[str, Any]]]:
    out = []
    for version in VERSIONS:
        record = msgspec.msgpack.decode((WIRE / f"{version}.msgpack").read_bytes())
        assert record["sglang_version"] == version
        out += [(version, case) for case in record["cases"]]
    return out


CASES = _cases()


@pytest.mark.parametrize(("version", "case"), CASES, ids=[f"{v}-{c['name']}" for v, c in CASES])
def test_sglang_forms_decode_losslessly(version: str, case: dict[str, Any]) -> None:
    stats = DecodeStats()
    batch = decode_batch(case["payload"], stats)
    assert batch.data_parallel_rank == case["rank"]  # SGLang's attn_dp_rank
    assert len(batch.events) == len(case["expect"])
    for event, expect in zip(batch.events, case["expect"], strict=True):
        assert type(event).__name__ == expect["type"]
        for name in event.__struct_fields__:
            assert getattr(event, name) == expect.get(name), (name, event)
    assert stats.malformed_events == stats.unknown_fields == stats.unknown_event_types == 0
    if version >= "0.5.20":  # tagged maps: the fast path, even with fields left out
        assert stats.slow_path_batches == 0


def test_all_sglang_versions_and_salt_forms_are_covered() -> None:
    names = {(v, c["name"]) for v, c in CASES}
    assert ("0.5.19", "salted") in names and ("0.5.23", "salted") in names
    assert ("0.5.23", "lora_no_medium") in names and ("0.5.23", "host_tier") in names


@pytest.mark.parametrize(
    ("medium", "tier"),
    [
        (None, "GPU"),
        ("GPU", "GPU"),
        ("CPU", "CPU"),
        ("CPU_PINNED", "CPU"),
        ("STORAGE", "STORAGE"),
        ("DISK", "STORAGE"),
        ("EXTERNAL", "STORAGE"),
        ("NVME", None),
    ],
)
def test_media_map_onto_tiers(medium: str | None, tier: str | None) -> None:
    assert normalise_medium(medium) == tier


def _store(**kw: Any) -> BlockStored:
    return BlockStored(
        block_hashes=[1, 2],
        parent_block_hash=None,
        token_ids=[1, 2, 3, 4],
        block_size=2,
        lora_id=None,
        medium="GPU",
        lora_name=None,
        **kw,
    )


def test_lookahead_token_ids_are_one_list_per_block() -> None:
    """vLLM 0.33 sends ``list[list[int]]``; a flat list used to be the declared type."""
    event = _store(lookahead_token_ids=[[5, 6], [7]])
    stats = DecodeStats()
    batch = decode_batch(encode_batch(KVEventBatch(0.0, [event])), stats)
    assert batch.events == [event]
    assert stats.slow_path_batches == 0


def test_cache_salt_is_omitted_when_none_and_round_trips_when_set() -> None:
    plain = encode_batch(KVEventBatch(0.0, [_store()]))
    assert b"cache_salt" not in plain  # vLLM's bytes unchanged
    salted = _store(cache_salt="tenant")
    assert decode_batch(encode_batch(KVEventBatch(0.0, [salted]))).events == [salted]
