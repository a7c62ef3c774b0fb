"""offload_core.base: offload key packing and the core value types."""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from offload_core.base import (
    LoadStoreSpec,
    OffloadingEvent,
    OffloadingManager,
    PrepareStoreOutput,
    ReqContext,
    get_offload_block_hash,
    get_offload_group_idx,
    make_offload_key,
)
from offload_core.cpu import CPULoadStoreSpec


@given(st.binary(min_size=0, max_size=64), st.integers(0, 2**32 - 1))
def test_key_round_trips(block_hash: bytes, group_idx: int) -> None:
    key = make_offload_key(block_hash, group_idx)
    assert isinstance(key, bytes)
    assert len(key) == len(block_hash) + 4
    assert get_offload_block_hash(key) == block_hash
    assert get_offload_group_idx(key) == group_idx


def test_key_layout_is_hash_then_big_endian_group() -> None:
    digest = hashlib.sha256(b"x").digest()
    key = make_offload_key(digest, 258)
    assert key == digest + b"\x00\x00\x01\x02"


def test_same_hash_in_two_groups_gives_two_keys() -> None:
    digest = hashlib.sha256(b"block").digest()
    assert make_offload_key(digest, 0) != make_offload_key(digest, 1)
    assert len({make_offload_key(digest, g) for g in range(8)}) == 8


@pytest.mark.parametrize("group_idx", [-1, 2**32])
def test_group_out_of_range_is_rejected(group_idx: int) -> None:
    with pytest.raises(ValueError):
        make_offload_key(b"\x00" * 32, group_idx)


def test_value_types() -> None:
    assert ReqContext().kv_transfer_params is None
    assert ReqContext({"do_remote_prefill": True}).kv_transfer_params == {"do_remote_prefill": True}
    spec = CPULoadStoreSpec([3, 1])
    assert isinstance(spec, LoadStoreSpec)
    assert spec.medium() == "CPU"
    out = PrepareStoreOutput([make_offload_key(b"a", 0)], spec)
    assert out.evicted_keys == []
    event = OffloadingEvent([make_offload_key(b"a", 2)], "CPU", removed=False)
    assert get_offload_group_idx(event.keys[0]) == 2


def test_abstract_types_cannot_be_instantiated() -> None:
    with pytest.raises(TypeError):
        OffloadingManager()  # type: ignore[abstract]
    with pytest.raises(TypeError):
        LoadStoreSpec()  # type: ignore[abstract]
