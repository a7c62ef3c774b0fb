"""The one safe decoder for KV event payloads.

Why two paths: almost every payload on a live fleet is vLLM's current form, which a typed
msgspec decode handles at full speed. Anything else (legacy positional events, more or
fewer fields, unknown event types, unknown fields) fails that strict decode and is then
normalised event by event on the slow path, which counts what it had to skip.

``decode_batch`` raises only ``DecodeError``; callers count it and carry on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec

from schemas.counters import CounterSet
from schemas.wire import (
    BLOCK_REMOVED_FIELDS,
    BLOCK_STORED_FIELDS,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventBatch,
    KVCacheEvent,
    KVEventBatch,
)


class DecodeError(ValueError):
    """A payload that is not a KV event batch at all (garbage, wrong shape, bad types)."""


@dataclass
class DecodeStats(CounterSet):
    """Counters the slow path fills in; the router exports them as metrics."""

    batches: int = 0
    slow_path_batches: int = 0
    legacy_events: int = 0
    unknown_event_types: int = 0
    unknown_fields: int = 0
    malformed_events: int = 0


# Strict twins of the wire structs: identical fields (same order, so the same layout) and
# tags, but unknown map keys (and trailing batch elements) are an error, so a payload
# carrying them leaves the fast path and gets counted. The nullable fields vLLM always
# sends may be absent here: SGLang 0.5.20+ encodes with omit_defaults and leaves out
# ``medium`` and ``lora_name`` when None, which is then exactly what they decode to.
class _StrictBlockStored(BlockStored, forbid_unknown_fields=True, tag="BlockStored"):
    lora_id: int | None = None
    medium: str | None = None
    lora_name: str | None = None


class _StrictBlockRemoved(BlockRemoved, forbid_unknown_fields=True, tag="BlockRemoved"):
    medium: str | None = None


class _StrictAllBlocksCleared(AllBlocksCleared, forbid_unknown_fields=True, tag="AllBlocksCleared"):
    pass


class _StrictBatch(EventBatch, forbid_unknown_fields=True):
    events: list[_StrictBlockStored | _StrictBlockRemoved | _StrictAllBlocksCleared]


_fast_decoder = msgspec.msgpack.Decoder(_StrictBatch)

# The strict twins must not leak: callers compare, match and re-encode public structs
# (a _StrictBlockStored never equals a BlockStored). The twins add no fields, so their
# instances share the public layout and can simply be re-labelled in place, which costs
# a few percent of decode time where rebuilding each struct would cost far more.
_PUBLIC: dict[type, type[KVCacheEvent]] = {
    _StrictBlockStored: BlockStored,
    _StrictBlockRemoved: BlockRemoved,
    _StrictAllBlocksCleared: AllBlocksCleared,
}


def _relabel(events: list[Any]) -> None:
    for event in events:
        event.__class__ = _PUBLIC[event.__class__]


def _rebuild(events: list[Any]) -> None:
    for i, event in enumerate(events):
        events[i] = _PUBLIC[event.__class__](**msgspec.structs.asdict(event))


def _pick_public_converter() -> Any:
    """Use ``_relabel`` unless this msgspec/Python refuses ``__class__`` assignment."""
    try:
        _relabel([_StrictAllBlocksCleared()])
    except TypeError:  # pragma: no cover - depends on the msgspec build
        return _rebuild
    return _relabel


_to_public = _pick_public_converter()


class PackedBlockStored(BlockStored, tag="BlockStored"):
    """A ``BlockStored`` whose ``token_ids`` are still bytes: their msgpack bytes
    (``Raw``, from ``decode_packed``) or the ids as native int32s (``bytes``, from
    ``decode_int32``). What the router's ingest gets, which chains block keys straight
    from those bytes (``router.ingest.packed``); never handed to anything else, never
    encoded."""

    token_ids: msgspec.Raw | bytes  # type: ignore[assignment]


class _StrictPackedBlockStored(_StrictBlockStored, tag="BlockStored"):
    token_ids: msgspec.Raw  # type: ignore[assignment]


class _StrictPackedBatch(EventBatch, forbid_unknown_fields=True):
    events: list[_StrictPackedBlockStored | _StrictBlockRemoved | _StrictAllBlocksCleared]


_packed_decoder = msgspec.msgpack.Decoder(_StrictPackedBatch)
_PUBLIC[_StrictPackedBlockStored] = PackedBlockStored


class _StrictInt32BlockStored(_StrictBlockStored, tag="BlockStored"):
    token_ids: bytes  # type: ignore[assignment]


class _StrictInt32Batch(EventBatch, forbid_unknown_fields=True):
    events: list[_StrictInt32BlockStored | _StrictBlockRemoved | _StrictAllBlocksCleared]


_int32_decoder = msgspec.msgpack.Decoder(_StrictInt32Batch)
_PUBLIC[_StrictInt32BlockStored] = PackedBlockStored


def decode_packed(payload: bytes) -> KVEventBatch | None:
    """``decode_batch``'s fast path with every store's ``token_ids`` left as msgpack
    bytes (``PackedBlockStored``; their values are not checked here), or None for any
    payload that fast path would not take. Counts nothing."""
    return _strict(_packed_decoder, payload)


def decode_int32(rewritten: bytes) -> KVEventBatch | None:
    """``decode_packed`` for a payload whose every ``token_ids`` array the compiled core
    rewrote as one bin of native int32s (``router.native``'s ``int32_tokens``): its stores
    are ``PackedBlockStored`` with those bytes as ``token_ids``. None where
    ``decode_packed`` would give None for the original payload."""
    return _strict(_int32_decoder, rewritten)


def _strict(decoder: msgspec.msgpack.Decoder[Any], payload: bytes) -> KVEventBatch | None:
    """A strict twin decoder's batch with public event types, or None where it refuses."""
    try:
        fast = decoder.decode(payload)
    except (msgspec.DecodeError, msgspec.ValidationError, ValueError, TypeError, RecursionError):
        return None
    _to_public(fast.events)
    return KVEventBatch(fast.ts, fast.events, fast.data_parallel_rank)


_generic_decoder = msgspec.msgpack.Decoder()

_MAP_TYPES: dict[str, type[KVCacheEvent]] = {
    "BlockStored": BlockStored,
    "BlockRemoved": BlockRemoved,
    "AllBlocksCleared": AllBlocksCleared,
}
_POSITIONAL: dict[str, tuple[str, ...]] = {
    "BlockStored": BLOCK_STORED_FIELDS,
    "BlockRemoved": BLOCK_REMOVED_FIELDS,
    "AllBlocksCleared": (),
}
# Nullable fields an engine may leave out (old positional events; SGLang's maps omit
# every None field); filled with None.
_OPTIONAL_FIELDS = {"medium", "lora_name", "lora_id", "parent_block_hash"}
# SGLang 0.5.18-0.5.19 append a metadata map ``{"cache_salt": ...}`` to a salted
# positional BlockStored, in the slot vLLM's positional form uses for ``lora_name``.
_SGLANG_METADATA_SLOT = BLOCK_STORED_FIELDS.index("lora_name")


def decode_batch(payload: bytes, stats: DecodeStats | None = None) -> KVEventBatch:
    """Decode one payload into a ``KVEventBatch``; raise only ``DecodeError``."""
    if stats is None:
        stats = DecodeStats()
    stats.batches += 1
    try:
        fast = _fast_decoder.decode(payload)
    except (msgspec.DecodeError, msgspec.ValidationError, ValueError, TypeError, RecursionError):
        pass
    else:
        _to_public(fast.events)
        return KVEventBatch(fast.ts, fast.events, fast.data_parallel_rank)  # type: ignore[arg-type]
    stats.slow_path_batches += 1
    return _decode_slow(payload, stats)


def _decode_slow(payload: bytes, stats: DecodeStats) -> KVEventBatch:
    try:
        raw = _generic_decoder.decode(payload)
    except (msgspec.DecodeError, ValueError, TypeError, RecursionError) as exc:
        raise DecodeError(f"not msgpack: {exc}") from None
    if not isinstance(raw, list) or len(raw) < 2:
        raise DecodeError("batch must be an array [ts, events, data_parallel_rank?]")
    ts, events = raw[0], raw[1]
    dp_rank = raw[2] if len(raw) > 2 else None
    if isinstance(ts, bool) or not isinstance(ts, int | float):
        raise DecodeError("batch ts must be a number")
    if not isinstance(events, list):
        raise DecodeError("batch events must be an array")
    if dp_rank is not None and (isinstance(dp_rank, bool) or not isinstance(dp_rank, int)):
        raise DecodeError("batch data_parallel_rank must be an int or nil")
    if len(raw) > 3:
        stats.unknown_fields += len(raw) - 3
    out: list[Any] = []
    for item in events:
        event = _normalise_event(item, stats)
        if event is not None:
            out.append(event)
    return KVEventBatch(float(ts), out, dp_rank)


def _normalise_event(item: Any, stats: DecodeStats) -> KVCacheEvent | None:
    if isinstance(item, dict):
        tag = item.get("type")
        cls = _MAP_TYPES.get(tag) if isinstance(tag, str) else None
        if cls is None:
            stats.unknown_event_types += 1
            return None
        known = set(cls.__struct_fields__)
        data = {k: v for k, v in item.items() if k in known}
        stats.unknown_fields += len(item) - 1 - len(data)
        _fill_optional(cls, data)
    elif isinstance(item, list) and item and isinstance(item[0], str):
        tag = item[0]
        names = _POSITIONAL.get(tag)
        if names is None:
            stats.unknown_event_types += 1
            return None
        cls = _MAP_TYPES[tag]
        stats.legacy_events += 1
        values = list(item[1:])
        metadata = None
        if (
            cls is BlockStored
            and len(values) > _SGLANG_METADATA_SLOT
            and isinstance(values[_SGLANG_METADATA_SLOT], dict)
        ):
            metadata = values.pop(_SGLANG_METADATA_SLOT)
            values[_SGLANG_METADATA_SLOT:] = []  # nothing follows it in SGLang's form
        if len(values) > len(names):
            stats.unknown_fields += len(values) - len(names)
        data = dict(zip(names, values, strict=False))
        if metadata is not None:
            data["cache_salt"] = metadata.get("cache_salt")
            stats.unknown_fields += sum(1 for k in metadata if k != "cache_salt")
        _fill_optional(cls, data)
    else:
        stats.malformed_events += 1
        return None
    try:
        return msgspec.convert(data, cls)
    except (msgspec.ValidationError, TypeError, ValueError, RecursionError):
        stats.malformed_events += 1
        return None


_NODEFAULT = object()


def _fill_optional(cls: type[msgspec.Struct], data: dict[str, Any]) -> None:
    for name, default in zip(cls.__struct_fields__, _defaults(cls), strict=True):
        if default is _NODEFAULT and name not in data and name in _OPTIONAL_FIELDS:
            data[name] = None


def _defaults(cls: type[msgspec.Struct]) -> list[Any]:
    n_fields = len(cls.__struct_fields__)
    defaults = list(cls.__struct_defaults__)
    return [_NODEFAULT] * (n_fields - len(defaults)) + defaults
