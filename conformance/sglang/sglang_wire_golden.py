"""Golden bytes of SGLang's KV event wire forms, produced by SGLang's own structs.

Usage: ``python sglang_wire_golden.py OUT_DIR VERSION=path/to/kv_events.py ...``.
For each given SGLang version the event and batch struct classes are taken from that
version's ``sglang/srt/disaggregation/kv_events.py`` (only the ``msgspec.Struct``
classes are executed: the module's other imports belong to a full server install) and
encoded with msgspec as SGLang's publisher does. The cases cover what each form can
carry: unsalted and salted stores, removals with and without a medium, the host medium,
a cleared cache, a DP rank. ``OUT_DIR/<version>.msgpack`` holds ``{"cases": [{"name",
"payload", "expect"}]}`` where ``expect`` is what the payload must decode to.
"""

from __future__ import annotations

import ast
import sys
import time  # noqa: F401  (some versions reference it in struct defaults)
from pathlib import Path
from typing import Any, Optional, Union

import msgspec

_WANTED = {
    "EventBatch",
    "KVCacheEvent",
    "BlockStoredMetadata",
    "BlockStored",
    "BlockStoredWithMetadata",
    "BlockRemoved",
    "AllBlocksCleared",
    "KVEventBatch",
}


def load_structs(path: Path) -> dict[str, Any]:
    tree = ast.parse(path.read_text())
    body = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name in _WANTED]
    ns: dict[str, Any] = {"msgspec": msgspec, "Optional": Optional, "Any": Any, "Union": Union}
    exec(compile(ast.Module(body=body, type_ignores=[]), str(path), "exec"), ns)
    return ns


def cases(ns: dict[str, Any]) -> list[dict[str, Any]]:
    stored_fields = ns["BlockStored"].__struct_fields__
    has_medium = "medium" in stored_fields
    has_salt_field = "cache_salt" in stored_fields
    with_meta = "BlockStoredWithMetadata" in ns
    batch = ns["KVEventBatch"]
    out = []

    def add(name: str, events: list[Any], expect: list[dict[str, Any]], rank: int = 0) -> None:
        payload = msgspec.msgpack.Encoder().encode(batch(ts=1.5, events=events, attn_dp_rank=rank))
        out.append({"name": name, "payload": payload, "expect": expect, "rank": rank})

    add("cleared", [ns["AllBlocksCleared"]()], [{"type": "AllBlocksCleared"}])
    kw = {"medium": "GPU"} if has_medium else {}
    store = {
        "block_hashes": [-5, 2**62],
        "parent_block_hash": None,
        "token_ids": [1, 2, 3, 4],
        "block_size": 2,
        "lora_id": None,
    }
    add(
        "store_and_remove",
        [
            ns["BlockStored"](**store, **kw),
            ns["BlockRemoved"](block_hashes=[-5], **kw),
        ],
        [
            {"type": "BlockStored", **store, "medium": kw.get("medium"), "cache_salt": None},
            {"type": "BlockRemoved", "block_hashes": [-5], "medium": kw.get("medium")},
        ],
        rank=1,
    )
    if has_medium:
        host = {**store, "parent_block_hash": 2**62, "block_hashes": [7]}
        host["token_ids"] = [5, 6]
        add(
            "host_tier",
            [
                ns["BlockStored"](**host, medium="CPU_PINNED"),
                ns["BlockRemoved"](block_hashes=[7], medium="CPU_PINNED"),
            ],
            [
                {"type": "BlockStored", **host, "medium": "CPU_PINNED", "cache_salt": None},
                {"type": "BlockRemoved", "block_hashes": [7], "medium": "CPU_PINNED"},
            ],
        )
    salted = None
    if has_salt_field:
        salted = ns["BlockStored"](**store, medium="GPU", cache_salt="tenant", session_id="s1")
    elif with_meta:
        meta = ns["BlockStoredMetadata"](cache_salt="tenant")
        salted = ns["BlockStoredWithMetadata"](**store, medium="GPU", metadata=meta)
    if salted is not None:
        expect = {"type": "BlockStored", **store, "medium": "GPU", "cache_salt": "tenant"}
        if has_salt_field:
            expect["session_id"] = "s1"
        add("salted", [salted], [expect])
    if "lora_name" in stored_fields:
        lora = ns["BlockStored"](**store, lora_name="adapter-x")  # medium left out (None)
        add(
            "lora_no_medium",
            [lora],
            [{"type": "BlockStored", **store, "medium": None, "lora_name": "adapter-x"}],
        )
    return out


def main(argv: list[str]) -> int:
    out_dir = Path(argv[0])
    out_dir.mkdir(parents=True, exist_ok=True)
    for spec in argv[1:]:
        version, _, path = spec.partition("=")
        record = {"sglang_version": version, "cases": cases(load_structs(Path(path)))}
        (out_dir / f"{version}.msgpack").write_bytes(msgspec.msgpack.encode(record))
        print(version, [c["name"] for c in record["cases"]])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
