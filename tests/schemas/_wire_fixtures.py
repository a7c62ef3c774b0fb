"""Readers for the vLLM 0.33 golden fixtures and the manifest's JSON form of a batch.

The manifest writes hashes as ints or ``{"bytes_hex": ...}`` and every struct field by
name (None included); ``batch_to_manifest`` renders a decoded batch the same way so a
test can compare with ``==`` and see every field.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec

from schemas import KVEvent, KVEventBatch

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vllm-0.33"
MANIFEST: dict[str, Any] = json.loads((FIXTURES / "manifest.json").read_text())
CASES: dict[str, dict[str, Any]] = MANIFEST["cases"]
CASE_NAMES = list(CASES)
HASH_FIELDS = ("block_hashes", "parent_block_hash")


def payload(kind: str, name: str) -> bytes:
    """Bytes of ``<kind>/<name>.msgpack`` (kind: events or legacy)."""
    return (FIXTURES / kind / f"{name}.msgpack").read_bytes()


def frames(name: str) -> list[list[bytes]]:
    """The multipart frames recorded in ``frames/<name>.msgpack``."""
    return msgspec.msgpack.decode((FIXTURES / "frames" / f"{name}.msgpack").read_bytes())


def hash_to_manifest(h: int | bytes | None) -> Any:
    return {"bytes_hex": h.hex()} if isinstance(h, bytes) else h


def hash_from_manifest(h: Any) -> int | bytes | None:
    return bytes.fromhex(h["bytes_hex"]) if isinstance(h, dict) else h


def _jsonish(value: Any) -> Any:
    if isinstance(value, tuple | list):
        return [_jsonish(v) for v in value]
    return value


# Our fields vLLM's structs do not have (SGLang's); the manifest lists vLLM's fields.
NON_VLLM_FIELDS = frozenset({"cache_salt"})


def event_to_manifest(event: KVEvent) -> dict[str, Any]:
    out: dict[str, Any] = {"type": type(event).__name__}
    for name in event.__struct_fields__:
        value = getattr(event, name)
        if name in NON_VLLM_FIELDS and value is None:
            continue
        if name == "block_hashes":
            out[name] = [hash_to_manifest(h) for h in value]
        elif name == "parent_block_hash":
            out[name] = hash_to_manifest(value)
        else:
            out[name] = _jsonish(value)
    return out


def batch_to_manifest(batch: KVEventBatch) -> dict[str, Any]:
    return {
        "ts": batch.ts,
        "data_parallel_rank": batch.data_parallel_rank,
        "events": [event_to_manifest(e) for e in batch.events],
    }


def expected_batch(case: dict[str, Any]) -> KVEventBatch:
    """Build the public structs a manifest case describes."""
    events = []
    for raw in case["events"]:
        data = dict(raw)
        if "block_hashes" in data:
            data["block_hashes"] = [hash_from_manifest(h) for h in data["block_hashes"]]
        if "parent_block_hash" in data:
            data["parent_block_hash"] = hash_from_manifest(data["parent_block_hash"])
        events.append(msgspec.convert(data, KVEvent))
    return KVEventBatch(ts=case["ts"], events=events, data_parallel_rank=case["data_parallel_rank"])
