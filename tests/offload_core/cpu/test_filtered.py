"""FilteredOffloadingManager: vLLM's ``store_threshold`` — a new block is stored only from
its N-th offer; everything else is forwarded unchanged."""

from __future__ import annotations

import hashlib

import pytest

from offload_core.base import OffloadKey, ReqContext, make_offload_key
from offload_core.cpu import CPUOffloadingManager, FilteredOffloadingManager

CTX = ReqContext()


def key(i: int) -> OffloadKey:
    return make_offload_key(hashlib.sha256(str(i).encode()).digest(), 1)


def test_stores_only_from_the_threshold_offer_on() -> None:
    inner = CPUOffloadingManager(8)
    m = FilteredOffloadingManager(inner, store_threshold=2)
    out = m.prepare_store([key(1), key(2)], CTX)
    assert out is not None and out.keys_to_store == []
    assert m.stores_skipped == 2
    out = m.prepare_store([key(1)], CTX)
    assert out is not None and out.keys_to_store == [key(1)]
    m.complete_store(out.keys_to_store, CTX)
    assert inner.is_ready(key(1)) and not inner.is_ready(key(2))
    assert m.offer_count(key(1)) == 2 and m.offer_count(key(2)) == 1
    # Lookups are not offers (vLLM counts prepare_store calls only).
    assert m.lookup(key(2), CTX) is False
    assert m.offer_count(key(2)) == 1


def test_resident_blocks_are_never_filtered() -> None:
    inner = CPUOffloadingManager(4)
    m = FilteredOffloadingManager(inner, store_threshold=3, max_tracker_size=1)
    for _ in range(3):
        out = m.prepare_store([key(1)], CTX)
    assert out is not None and out.keys_to_store == [key(1)]  # not completed yet
    m.prepare_store([key(2)], CTX)  # pushes key 1's count out of the 1-entry tracker
    assert m.offer_count(key(1)) == 0
    skipped = m.stores_skipped
    m.prepare_store([key(1)], CTX)  # being stored: forwarded, not counted as skipped
    assert m.stores_skipped == skipped


def test_forwards_everything_else() -> None:
    inner = CPUOffloadingManager(2)
    m = FilteredOffloadingManager(inner, store_threshold=2)
    m.prepare_store([key(1), key(2), key(3)], CTX)
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
    m = FilteredOffloadingManager(inner, store_threshold=2)
    m.prepare_store([key(1)], CTX)
    out = m.prepare_store([key(1)], CTX)
    assert out is not None and out.keys_to_store == [key(1)]
    m.complete_store(out.keys_to_store, CTX, success=False)
    assert not inner.is_ready(key(1)) and inner.num_free_blocks == 2


def test_tracker_is_bounded_and_protects_the_current_offer() -> None:
    m = FilteredOffloadingManager(CPUOffloadingManager(4), store_threshold=2, max_tracker_size=3)
    for i in range(5):
        m.prepare_store([key(i)], CTX)
    assert len(m) == 3
    assert m.offer_count(key(0)) == 0 and m.offer_count(key(1)) == 0
    m.prepare_store([key(2), key(9)], CTX)  # 2 is protected; 9 pushes out the oldest (3)
    assert m.offer_count(key(2)) == 2 and m.offer_count(key(3)) == 0
    assert m.offer_count(key(9)) == 1
    # An offer larger than the tracker counts what fits and never evicts its own keys.
    m2 = FilteredOffloadingManager(CPUOffloadingManager(8), store_threshold=2, max_tracker_size=2)
    m2.prepare_store([key(1), key(2), key(3)], CTX)
    assert len(m2) == 2


def test_invalid_arguments() -> None:
    with pytest.raises(ValueError):
        FilteredOffloadingManager(CPUOffloadingManager(1), store_threshold=1)
    with pytest.raises(ValueError):
        FilteredOffloadingManager(CPUOffloadingManager(1), max_tracker_size=0)
