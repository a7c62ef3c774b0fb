"""Wire structs (vLLM-compatible KV events) and REST models. No I/O here."""

from schemas.decode import DecodeError, DecodeStats, decode_batch
from schemas.wire import (
    MEDIA,
    MEDIUM_ALIASES,
    MEDIUM_CPU,
    MEDIUM_GPU,
    MEDIUM_STORAGE,
    REPLAY_END_SEQ,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventBatch,
    ExternalBlockHash,
    KVCacheEvent,
    KVEvent,
    KVEventBatch,
    encode_batch,
    normalise_medium,
)

__all__ = [
    "MEDIA",
    "MEDIUM_ALIASES",
    "MEDIUM_CPU",
    "MEDIUM_GPU",
    "MEDIUM_STORAGE",
    "REPLAY_END_SEQ",
    "AllBlocksCleared",
    "BlockRemoved",
    "BlockStored",
    "DecodeError",
    "DecodeStats",
    "EventBatch",
    "ExternalBlockHash",
    "KVCacheEvent",
    "KVEvent",
    "KVEventBatch",
    "decode_batch",
    "encode_batch",
    "normalise_medium",
]
