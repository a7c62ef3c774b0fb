"""vLLM-compatible KV event wire structs.

Field order and struct options mirror vLLM 0.33's ``vllm.distributed.kv_events`` so that
``encode_batch`` produces the very bytes vLLM would (proved by the golden fixtures):

* the batch is an ``array_like`` struct ``[ts, events, data_parallel_rank]``;
* each event is a **map** tagged with ``"type"``; the seven historical BlockStored fields
  are always present (even when None), later fields are omitted when None.

Older vLLM and SGLang (0.5.2-0.5.19) send events as positional arrays
``[tag, field0, field1, ...]``; SGLang 0.5.20+ sends tagged maps that leave out every
None field (``medium`` and ``lora_name`` included). ``schemas.decode`` accepts all of
them; see docs/sglang.md for SGLang's fields and media.
"""

from __future__ import annotations

from typing import Any

import msgspec

# An engine's block hash on the wire: the low 64 bits of the digest (int) or the digest.
ExternalBlockHash = int | bytes

# Tier names used by vLLM for the `medium` field.
MEDIUM_GPU = "GPU"
MEDIUM_CPU = "CPU"
MEDIUM_STORAGE = "STORAGE"
MEDIA = (MEDIUM_GPU, MEDIUM_CPU, MEDIUM_STORAGE)

# Other engines' medium names -> the tier with the same semantics. SGLang 0.5.x:
# "CPU_PINNED" is its host (L2) tier; "DISK" (L3, local SSD) and "EXTERNAL" (L4, a shared
# or remote pool such as Mooncake) both hold blocks that must be loaded before use, which
# is what STORAGE means here. Events keep the engine's own string (lossless decode); the
# router maps it with ``normalise_medium`` wherever it needs a tier.
MEDIUM_ALIASES: dict[str, str] = {
    MEDIUM_GPU: MEDIUM_GPU,
    MEDIUM_CPU: MEDIUM_CPU,
    MEDIUM_STORAGE: MEDIUM_STORAGE,
    "CPU_PINNED": MEDIUM_CPU,
    "DISK": MEDIUM_STORAGE,
    "EXTERNAL": MEDIUM_STORAGE,
}


def normalise_medium(medium: str | None) -> str | None:
    """The tier of an event's ``medium`` (None -> GPU, the engines' default); None when
    the name is unknown."""
    if medium is None:
        return MEDIUM_GPU
    return MEDIUM_ALIASES.get(medium)


# ZMQ framing around the batches (docs/design.md#wire-format): a replay answer ends with the marker
# ``[b"", b"", REPLAY_END_SEQ, b""]``, seq -1 as 8 signed big-endian bytes.
REPLAY_END_SEQ = (-1).to_bytes(8, "big", signed=True)


class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """Base batch: ``[ts, events, data_parallel_rank]``."""

    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class KVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    """Base class of every KV cache event (tagged map, tag field ``"type"``)."""


class BlockStored(KVCacheEvent):
    """Blocks entered a tier; ``block_hashes`` chain from ``parent_block_hash``."""

    block_hashes: list[ExternalBlockHash]
    parent_block_hash: ExternalBlockHash | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None
    locality: str | None = None
    ownership: str | None = None
    session_id: str | None = None
    # vLLM 0.33: one list of lookahead tokens per block.
    lookahead_token_ids: list[list[int]] | None = None
    # SGLang 0.5.20+: the salt that seeded the chain (vLLM puts it in extra_keys).
    cache_salt: str | None = None


class BlockRemoved(KVCacheEvent):
    """Blocks left a tier (evicted, or dropped from the CPU/STORAGE tier)."""

    block_hashes: list[ExternalBlockHash]
    medium: str | None
    group_idx: int | None = None
    locality: str | None = None
    ownership: str | None = None


class AllBlocksCleared(KVCacheEvent):
    """The engine dropped its whole prefix cache (reset)."""


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared


class KVEventBatch(EventBatch):
    """One published message: a timestamp, events in order, the DP rank."""

    events: list[KVEvent]


# Positional field order of legacy (array-form) events, after the tag.
BLOCK_STORED_FIELDS: tuple[str, ...] = BlockStored.__struct_fields__
BLOCK_REMOVED_FIELDS: tuple[str, ...] = BlockRemoved.__struct_fields__
EVENT_TYPES: dict[str, type[KVCacheEvent]] = {
    "BlockStored": BlockStored,
    "BlockRemoved": BlockRemoved,
    "AllBlocksCleared": AllBlocksCleared,
}

_encoder = msgspec.msgpack.Encoder()


def encode_batch(batch: KVEventBatch) -> bytes:
    """Encode a batch exactly as vLLM 0.33 does (tagged-map events)."""
    return _encoder.encode(batch)
