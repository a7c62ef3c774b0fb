"""The golden vLLM 0.33 fixtures, both directions, byte for byte.

* ``events/``: vLLM's current tagged-map form. Decodes (on the fast path) to exactly the
  manifest, and the decoded batch re-encodes to the very same bytes.
* ``legacy/``: the same batches as positional arrays (older vLLM, SGLang). An array
  carries only a prefix of the fields, so the rule is: the fields it carries equal the
  manifest's, every field after them decodes to None.
* ``frames/``: what a SUB and a replay DEALER received from vLLM's publisher.
"""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from _wire_fixtures import (
    CASE_NAMES,
    CASES,
    MANIFEST,
    batch_to_manifest,
    expected_batch,
    frames,
    payload,
)

from schemas import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    DecodeStats,
    decode_batch,
    encode_batch,
)

END_MARKER = [b"", b"", (-1).to_bytes(8, "big", signed=True), b""]


def test_manifest_lists_every_fixture_file() -> None:
    assert len(CASE_NAMES) == 5
    for name in CASE_NAMES:
        assert payload("events", name) and payload("legacy", name)


@pytest.mark.parametrize("name", CASE_NAMES)
def test_events_decode_to_exactly_the_manifest(name: str) -> None:
    stats = DecodeStats()
    batch = decode_batch(payload("events", name), stats)
    assert batch_to_manifest(batch) == CASES[name]
    assert batch == expected_batch(CASES[name])
    for event in batch.events:
        assert type(event) in (BlockStored, BlockRemoved, AllBlocksCleared)
    # vLLM's own form must never need the slow path.
    assert stats.slow_path_batches == 0
    assert stats.unknown_fields == stats.unknown_event_types == stats.malformed_events == 0


@pytest.mark.parametrize("name", CASE_NAMES)
def test_events_reencode_byte_identically(name: str) -> None:
    raw = payload("events", name)
    assert encode_batch(decode_batch(raw)) == raw
    assert encode_batch(expected_batch(CASES[name])) == raw


def _legacy_expectation(case: dict[str, Any], raw_events: list[list[Any]]) -> dict[str, Any]:
    """The manifest case with every field a positional event does not carry set to None."""
    events = []
    for want, raw in zip(case["events"], raw_events, strict=True):
        carried = len(raw) - 1  # minus the tag
        names = [k for k in want if k != "type"]
        assert len(names) >= carried
        events.append(
            {"type": want["type"]}
            | {k: want[k] if i < carried else None for i, k in enumerate(names)}
        )
    return {**case, "events": events}


@pytest.mark.parametrize("name", CASE_NAMES)
def test_legacy_positional_events_decode_to_the_fields_they_carry(name: str) -> None:
    raw = payload("legacy", name)
    raw_events = msgspec.msgpack.decode(raw)[1]
    assert all(isinstance(e, list) for e in raw_events)
    stats = DecodeStats()
    batch = decode_batch(raw, stats)
    assert batch_to_manifest(batch) == _legacy_expectation(CASES[name], raw_events)
    assert stats.legacy_events == len(raw_events)
    assert stats.unknown_fields == stats.unknown_event_types == stats.malformed_events == 0


def test_legacy_rule_is_not_vacuous() -> None:
    """lora_salt_extra_keys' legacy form stops before session_id, which the map form has."""
    case = CASES["lora_salt_extra_keys"]
    assert case["events"][0]["session_id"] == "sess-42"
    batch = decode_batch(payload("legacy", "lora_salt_extra_keys"))
    event = batch.events[0]
    assert isinstance(event, BlockStored)
    assert event.session_id is None
    assert event.extra_keys == [("sql-adapter", "tenant-a")]
    assert event.lora_id == 7 and event.lora_name == "sql-adapter"


def _as_published(name: str) -> Any:
    """A manifest case as vLLM's publisher sends it: a missing DP rank becomes rank 0."""
    batch = expected_batch(CASES[name])
    if batch.data_parallel_rank is None:
        batch.data_parallel_rank = 0
    return batch


def test_live_frames_topic_seq_and_payload() -> None:
    live = frames("live")
    info = MANIFEST["frames"]
    assert len(live) == info["live_count"] == len(CASE_NAMES)
    for seq, (frame, name) in enumerate(zip(live, CASE_NAMES, strict=True)):
        topic, seq_bytes, body = frame
        assert topic == info["topic"].encode() == b"kv@worker-0@demo"
        assert seq_bytes == seq.to_bytes(8, "big")
        want = _as_published(name)
        assert decode_batch(body) == want
        assert body == encode_batch(want)


def test_live_frames_carry_the_publishers_rank() -> None:
    ranks = [decode_batch(f[2]).data_parallel_rank for f in frames("live")]
    # Only offload_cpu_bytes_hashes had a rank (1) of its own; the rest got rank 0.
    assert ranks == [0, 0, 1, 0, 0]


def test_replay_frames_match_live_from_seq_2_then_end_marker() -> None:
    live, replay = frames("live"), frames("replay")
    assert len(replay) == MANIFEST["frames"]["replay_count"] == 4
    for frame, live_frame in zip(replay[:-1], live[2:], strict=True):
        assert frame == [b"", *live_frame]
    assert replay[-1] == END_MARKER
    assert int.from_bytes(replay[-1][2], "big", signed=True) == -1
