"""The safe decoder on hand-made payloads: what it tolerates, what it counts, what it rejects."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from _wire_fixtures import CASE_NAMES, payload

from schemas import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    DecodeError,
    DecodeStats,
    KVEventBatch,
    decode_batch,
    encode_batch,
)
from schemas import decode as decode_module

TOKENS = list(range(16))
H1, H2 = 0xF000_0000_0000_0001, bytes(range(32))


def enc(obj: Any) -> bytes:
    return msgspec.msgpack.encode(obj)


def stored_map(**extra: Any) -> dict[str, Any]:
    return {
        "type": "BlockStored",
        "block_hashes": [H1],
        "parent_block_hash": None,
        "token_ids": TOKENS,
        "block_size": 16,
        "lora_id": None,
        "medium": "GPU",
        "lora_name": None,
        **extra,
    }


def stored(**kw: Any) -> BlockStored:
    base: dict[str, Any] = dict(
        block_hashes=[H1],
        parent_block_hash=None,
        token_ids=TOKENS,
        block_size=16,
        lora_id=None,
        medium="GPU",
        lora_name=None,
    )
    return BlockStored(**(base | kw))


def decode(obj: Any) -> tuple[KVEventBatch, DecodeStats]:
    stats = DecodeStats()
    return decode_batch(enc(obj), stats), stats


def test_fast_path_returns_the_public_struct_types() -> None:
    """Regression: the fast path used to hand out its private strict subclasses, which
    never compare equal to BlockStored/BlockRemoved/AllBlocksCleared."""
    raw = [
        1.0,
        [
            stored_map(),
            {"type": "BlockRemoved", "block_hashes": [H1], "medium": "GPU"},
            {"type": "AllBlocksCleared"},
        ],
        3,
    ]
    batch, stats = decode(raw)
    assert stats.slow_path_batches == 0
    assert [type(e) for e in batch.events] == [BlockStored, BlockRemoved, AllBlocksCleared]
    assert batch == KVEventBatch(
        ts=1.0,
        events=[stored(), BlockRemoved(block_hashes=[H1], medium="GPU"), AllBlocksCleared()],
        data_parallel_rank=3,
    )
    assert "Strict" not in repr(batch)


def test_rebuild_fallback_matches_relabel() -> None:
    """The fallback used where ``__class__`` assignment is refused gives the same result."""
    for name in CASE_NAMES:
        raw = payload("events", name)
        fast = decode_module._fast_decoder.decode(raw)
        decode_module._rebuild(fast.events)
        assert KVEventBatch(fast.ts, fast.events, fast.data_parallel_rank) == decode_batch(raw)


def test_batch_without_data_parallel_rank() -> None:
    batch, stats = decode([2.5, [stored_map()]])
    assert batch.data_parallel_rank is None and batch.events == [stored()]
    assert stats.slow_path_batches == 0


def test_int_ts_and_trailing_batch_fields() -> None:
    batch, stats = decode([7, [], 1, "future", {"x": 1}])
    assert batch == KVEventBatch(ts=7.0, events=[], data_parallel_rank=1)
    assert isinstance(batch.ts, float)
    assert stats.unknown_fields == 2


def test_int_and_bytes_hashes_mixed() -> None:
    batch, _ = decode([1.0, [stored_map(block_hashes=[H1, H2], parent_block_hash=H2)]])
    assert batch.events == [stored(block_hashes=[H1, H2], parent_block_hash=H2)]


def test_unknown_map_fields_are_skipped_and_counted() -> None:
    ev = stored_map(group_idx=1, brand_new_field=[1, 2], another="x")
    rm = {"type": "BlockRemoved", "block_hashes": [H2], "medium": "CPU", "tier_hint": 3}
    batch, stats = decode([1.0, [ev, rm], 0])
    assert batch.events == [stored(group_idx=1), BlockRemoved(block_hashes=[H2], medium="CPU")]
    assert stats.unknown_fields == 3 and stats.slow_path_batches == 1
    assert stats.malformed_events == stats.unknown_event_types == 0


def test_unknown_event_types_are_skipped_and_counted() -> None:
    events = [
        {"type": "BlockPinned", "block_hashes": [H1]},
        ["KVCacheResized", 12],
        stored_map(),
        {"no_type": 1},
        ["AllBlocksCleared"],
    ]
    batch, stats = decode([1.0, events, None])
    assert batch.events == [stored(), AllBlocksCleared()]
    assert stats.unknown_event_types == 3
    assert stats.legacy_events == 1


@pytest.mark.parametrize(
    ("raw", "want"),
    [
        # vLLM <= 0.8 / SGLang: five BlockStored fields, no medium.
        (["BlockStored", [H1], None, TOKENS, 16, None], stored(medium=None)),
        # then medium was appended (six fields).
        (
            ["BlockStored", [H1], H2, TOKENS, 16, 3, "CPU"],
            stored(parent_block_hash=H2, lora_id=3, medium="CPU"),
        ),
        # only the four required fields.
        (["BlockStored", [H1], None, TOKENS, 16], stored(medium=None)),
        (["BlockRemoved", [H1, H2]], BlockRemoved(block_hashes=[H1, H2], medium=None)),
        (
            ["BlockRemoved", [H1], "GPU", 2],
            BlockRemoved(block_hashes=[H1], medium="GPU", group_idx=2),
        ),
        (["AllBlocksCleared"], AllBlocksCleared()),
    ],
)
def test_legacy_events_with_fewer_fields(raw: list[Any], want: Any) -> None:
    batch, stats = decode([1.0, [raw]])
    assert batch.events == [want]
    assert stats.legacy_events == 1 and stats.unknown_fields == 0


def test_legacy_events_with_more_fields_keep_the_known_prefix() -> None:
    n_known = len(BlockStored.__struct_fields__)
    raw = ["BlockStored", [H1], None, TOKENS, 16, None, "GPU", None] + [None] * (n_known - 7)
    raw += ["future-1", 99]
    removed = ["BlockRemoved", [H1], "GPU", 0, None, None, "extra"]
    cleared = ["AllBlocksCleared", "why"]
    batch, stats = decode([1.0, [raw, removed, cleared]])
    assert batch.events == [
        stored(),
        BlockRemoved(block_hashes=[H1], medium="GPU", group_idx=0),
        AllBlocksCleared(),
    ]
    assert stats.unknown_fields == 4 and stats.legacy_events == 3


@pytest.mark.parametrize(
    "bad_event",
    [
        ["BlockStored", [H1]],  # token_ids/block_size missing
        ["BlockStored", "not-a-list", None, TOKENS, 16],
        stored_map(token_ids=["a", "b"]),
        stored_map(block_size="16"),
        {"type": "BlockRemoved"},
        42,
        "BlockStored",
        [],
        [7, 8],
        None,
    ],
)
def test_malformed_events_are_skipped_and_counted(bad_event: Any) -> None:
    batch, stats = decode([1.0, [bad_event, stored_map()], 0])
    assert batch.events == [stored()]
    assert stats.malformed_events + stats.unknown_event_types == 1


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"\xc1",  # never-used msgpack byte
        b"\x93\xcb",  # truncated
        enc({"ts": 1.0, "events": []}),
        enc([1.0]),
        enc(["now", []]),
        enc([True, []]),
        enc([1.0, {"a": 1}]),
        enc([1.0, [], "rank-0"]),
        enc([1.0, [], False]),
        enc("KVEventBatch"),
        enc(None),
    ],
)
def test_malformed_batches_raise_decode_error(raw: bytes) -> None:
    with pytest.raises(DecodeError):
        decode_batch(raw)


def _nested(depth: int) -> bytes:
    return b"\x91" * depth + b"\x01"  # [[[...[1]...]]]


def test_deep_nesting_is_a_decode_error_not_a_recursion_error() -> None:
    """Regression: deep nesting inside a tagged event escaped as RecursionError."""
    head = enc(stored_map())
    assert head[0] == 0x88  # fixmap of 8 entries; add a 9th: extra_keys
    event = b"\x89" + head[1:] + enc("extra_keys") + b"\x91" + _nested(100_000)
    body = b"\x93" + enc(1.0) + b"\x91" + event + b"\xc0"
    with pytest.raises(DecodeError):
        decode_batch(body)
    with pytest.raises(DecodeError):
        decode_batch(_nested(100_000))


def test_moderate_nesting_in_extra_keys_is_fine() -> None:
    deep: Any = 1
    for _ in range(50):
        deep = [deep]
    batch, _ = decode([1.0, [stored_map(extra_keys=[deep, None])]])
    event = batch.events[0]
    assert isinstance(event, BlockStored) and event.extra_keys is not None
    assert event.extra_keys[1] is None and isinstance(event.extra_keys[0], tuple)


def test_stats_accumulate_and_export() -> None:
    stats = DecodeStats()
    decode_batch(payload("events", "hybrid_groups"), stats)
    decode_batch(payload("legacy", "hybrid_groups"), stats)
    d = stats.as_dict()
    assert d["batches"] == 2 and d["slow_path_batches"] == 1 and d["legacy_events"] == 3


def test_slow_path_result_reencodes_as_vllm_form() -> None:
    """A legacy batch, once decoded, is sent on as vLLM's current (map) form."""
    legacy = decode_batch(payload("legacy", "single_group_ints"))
    assert encode_batch(legacy) == payload("events", "single_group_ints")
