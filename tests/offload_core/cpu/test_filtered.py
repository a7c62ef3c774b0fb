"""FilteredOffloadingManager: store only blocks looked up N times, forward the rest."""

from __future__ import annotations

import hashlib

import pytest

from offload_core.base import OffloadKey, ReqContext, make_offload_key
from offload_core.cpu import CPUOffloadingManager, FilteredOffloadingManager

CTX = ReqContext()


def key(i: int) -> OffloadKey:
    return make_offload_key(hashlib.sha256(str(i).encode()).digest(), 1)


def test_stores_only_after_enough_lookups() -> None:
    inner = CPUOffloadingManager(8)
    m = FilteredOffloadingManager(inner, min_lookups=2)
    assert m.lookup(key(1), CTX) is False
    out = m.prepare_store([key(1), key(2)], CTX)
    assert out is not None and out.keys_to_store == []
    assert m.filtered_keys == 2
    assert m.lookup(key(1), CTX) is False
    out = m.prepare_store([key(1), key(2)], CTX)
    assert out is not None and out.keys_to_store == [key(1)]
    m.complete_store(out.keys_to_store, CTX)
    assert m.lookup(key(1), CTX) is True
    assert inner.is_ready(key(1)) and not inner.is_ready(key(2))
    assert m.lookup_count(key(1)) == 3


def test_forwards_everything_else() -> None:
    inner = CPUOffloadingManager(2)
    m = FilteredOffloadingManager(inner, min_lookups=1)
    m.note_lookups([key(1), key(2), key(3)])
    out = m.prepare_store([key(1), key(2)], CTX)
    assert out is not None
    m.complete_store(out.keys_to_store, CTX)
    (ev,) = m.take_events()
    assert ev.keys == [key(1), key(2)] and not ev.removed
    spec = m.prepare_load([key(2)], CTX)
    assert spec.block_ids == inner.block_ids([key(2)])  # type: ignore[attr-defined]
    assert inner.ref_count(key(2)) == 1
    m.touch([key(1)], CTX)
    out = m.prepare_store([key(3)], CTX)  # 2 is pinned: 1 goes even though just touched
    assert out is not None and out.evicted_keys == [key(1)]
    m.complete_load([key(2)], CTX)
    assert inner.ref_count(key(2)) == 0
    # Inspection helpers of the wrapped manager are reachable through the wrapper.
    assert m.is_ready(key(2)) and m.num_free_blocks == 0


def test_failed_store_is_forwarded() -> None:
    inner = CPUOffloadingManager(2)
    m = FilteredOffloadingManager(inner, min_lookups=1)
    m.lookup(key(1), CTX)
    out = m.prepare_store([key(1)], CTX)
    assert out is not None
    m.complete_store(out.keys_to_store, CTX, success=False)
    assert not inner.is_ready(key(1)) and inner.num_free_blocks == 2


def test_counter_memory_is_bounded() -> None:
    m = FilteredOffloadingManager(CPUOffloadingManager(4), min_lookups=2, max_tracked=3)
    for i in range(5):
        m.lookup(key(i), CTX)
    m.lookup(key(2), CTX)
    assert len(m) == 3
    assert m.lookup_count(key(0)) == 0 and m.lookup_count(key(1)) == 0
    m.lookup(key(0), CTX)  # forgotten: starts again at 1 and pushes out the oldest (3)
    assert m.lookup_count(key(0)) == 1 and m.lookup_count(key(3)) == 0
    assert m.lookup_count(key(2)) == 2


def test_invalid_arguments() -> None:
    with pytest.raises(ValueError):
        FilteredOffloadingManager(CPUOffloadingManager(1), min_lookups=0)
    with pytest.raises(ValueError):
        FilteredOffloadingManager(CPUOffloadingManager(1), max_tracked=0)
