"""Property: whatever the bytes, ``decode_batch`` returns a valid batch or raises
``DecodeError`` -- never any other exception.

"Valid" means: a ``KVEventBatch`` whose events are the public struct types and whose
encoding survives vLLM's plain typed decoder unchanged (so every field has its type).
"""

from __future__ import annotations

from typing import Any

import msgspec
from _wire_fixtures import CASE_NAMES, payload
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

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

SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
FIXTURE_PAYLOADS = [payload(kind, name) for kind in ("events", "legacy") for name in CASE_NAMES]
_typed = msgspec.msgpack.Decoder(KVEventBatch)


def check(raw: bytes) -> None:
    stats = DecodeStats()
    try:
        batch = decode_batch(raw, stats)
    except DecodeError:
        return
    assert type(batch) is KVEventBatch
    assert isinstance(batch.ts, float)
    assert batch.data_parallel_rank is None or type(batch.data_parallel_rank) is int
    for event in batch.events:
        assert type(event) in (BlockStored, BlockRemoved, AllBlocksCleared)
    encoded = encode_batch(batch)
    assert encode_batch(_typed.decode(encoded)) == encoded
    assert stats.batches == 1


@SETTINGS
@given(st.binary(max_size=512))
def test_random_bytes(raw: bytes) -> None:
    check(raw)


@SETTINGS
@given(st.sampled_from(FIXTURE_PAYLOADS), st.data())
def test_truncated_fixture_payloads(raw: bytes, data: st.DataObject) -> None:
    cut = data.draw(st.integers(min_value=0, max_value=len(raw)))
    check(raw[:cut])


@SETTINGS
@given(
    st.sampled_from(FIXTURE_PAYLOADS),
    st.lists(st.tuples(st.integers(min_value=0), st.integers(0, 255)), min_size=1, max_size=8),
)
def test_mutated_fixture_payloads(raw: bytes, edits: list[tuple[int, int]]) -> None:
    buf = bytearray(raw)
    for pos, value in edits:
        buf[pos % len(buf)] = value
    check(bytes(buf))


@SETTINGS
@given(st.sampled_from(FIXTURE_PAYLOADS), st.data())
def test_spliced_fixture_payloads(raw: bytes, data: st.DataObject) -> None:
    """Insert or delete a run of bytes: shifts every later length prefix."""
    at = data.draw(st.integers(0, len(raw)))
    if data.draw(st.booleans()):
        raw = raw[:at] + data.draw(st.binary(min_size=1, max_size=16)) + raw[at:]
    else:
        raw = raw[:at] + raw[at + data.draw(st.integers(1, 16)) :]
    check(raw)


# Well-formed msgpack with the right overall shape and hostile contents: this reaches
# the slow path's per-event normalisation, which random bytes rarely get to.
_scalar = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=True)
    | st.text(max_size=8)
    | st.binary(max_size=33)
)
_value = st.recursive(
    _scalar,
    lambda kids: (
        st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=6), kids, max_size=4)
    ),
    max_leaves=12,
)
_TAGS = st.sampled_from(["BlockStored", "BlockRemoved", "AllBlocksCleared", "Other"])
_FIELD = st.sampled_from(
    [*BlockStored.__struct_fields__, "type", "medium", "group_idx", "surprise"]
)
_map_event = st.builds(
    lambda tag, fields: {"type": tag, **fields},
    _TAGS,
    st.dictionaries(_FIELD, _value, max_size=10),
)
_array_event = st.builds(lambda tag, rest: [tag, *rest], _TAGS, st.lists(_value, max_size=18))
_event = _map_event | _array_event | _value


@SETTINGS
@given(
    st.one_of(st.floats(), st.integers(min_value=-(2**63), max_value=2**64 - 1), _value),
    st.lists(_event, max_size=6),
    st.none() | st.integers(min_value=-(2**63), max_value=2**64 - 1) | _value,
    st.lists(_value, max_size=2),
)
def test_structured_hostile_batches(ts: Any, events: Any, rank: Any, trailing: Any) -> None:
    check(msgspec.msgpack.encode([ts, events, rank, *trailing]))


@SETTINGS
@given(st.lists(_map_event | _array_event, max_size=6))
def test_event_lists_never_break_the_batch(events: Any) -> None:
    """With a sound envelope the batch always decodes; bad events are only skipped."""
    stats = DecodeStats()
    batch = decode_batch(msgspec.msgpack.encode([1.0, events, 0]), stats)
    skipped = stats.unknown_event_types + stats.malformed_events
    assert len(batch.events) + skipped == len(events)
