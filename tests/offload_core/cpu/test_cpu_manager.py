"""CPUOffloadingManager: store/load protocol, ref counts, failed stores, events."""

from __future__ import annotations

import hashlib
import random

import pytest

from offload_core.base import (
    OffloadingEvent,
    OffloadKey,
    ReqContext,
    get_offload_block_hash,
    get_offload_group_idx,
    make_offload_key,
)
from offload_core.cpu import CPULoadStoreSpec, CPUOffloadingManager

CTX = ReqContext()


def key(i: int, group: int = 0) -> OffloadKey:
    return make_offload_key(hashlib.sha256(str(i).encode()).digest(), group)


def store(m: CPUOffloadingManager, *ids: int, success: bool = True) -> list[OffloadKey]:
    keys = [key(i) for i in ids]
    out = m.prepare_store(keys, CTX)
    assert out is not None
    m.complete_store(out.keys_to_store, CTX, success=success)
    return out.keys_to_store


def events(m: CPUOffloadingManager) -> list[tuple[bool, list[OffloadKey]]]:
    out = []
    for ev in m.take_events():
        assert ev.medium == "CPU"
        out.append((ev.removed, ev.keys))
    return out


def test_store_becomes_ready_only_after_completion() -> None:
    m = CPUOffloadingManager(4)
    out = m.prepare_store([key(1), key(2)], CTX)
    assert out is not None
    assert out.keys_to_store == [key(1), key(2)]
    assert isinstance(out.store_spec, CPULoadStoreSpec)
    assert out.store_spec.block_ids == [0, 1]
    assert out.evicted_keys == []
    assert m.lookup(key(1), CTX) is False
    assert not m.is_ready(key(1))
    assert list(m.take_events()) == []  # nothing announced before completion
    m.complete_store(out.keys_to_store, CTX)
    assert m.lookup(key(1), CTX) is True
    assert m.is_ready(key(2))
    assert events(m) == [(False, [key(1), key(2)])]
    assert m.num_free_blocks == 2


def test_prepare_store_skips_stored_pending_and_duplicate_keys() -> None:
    m = CPUOffloadingManager(8)
    store(m, 1)
    pending = m.prepare_store([key(2)], CTX)
    assert pending is not None
    out = m.prepare_store([key(1), key(2), key(3), key(3), key(4)], CTX)
    assert out is not None
    assert out.keys_to_store == [key(3), key(4)]
    assert len(out.store_spec.block_ids) == 2  # type: ignore[attr-defined]
    assert len(set(m.block_ids([key(1), key(2), key(3), key(4)]))) == 4


def test_lru_eviction_order_and_removal_events() -> None:
    m = CPUOffloadingManager(3, policy="lru")
    store(m, 1, 2, 3)
    m.touch([key(1)], CTX)  # 2 is now the oldest
    m.take_events()
    out = m.prepare_store([key(4), key(5)], CTX)
    assert out is not None
    assert out.evicted_keys == [key(2), key(3)]
    assert not m.lookup(key(2), CTX)
    assert m.lookup(key(1), CTX)
    assert sorted(out.store_spec.block_ids) == sorted(m.block_ids([key(4), key(5)]))  # type: ignore[attr-defined]
    m.complete_store(out.keys_to_store, CTX)
    assert events(m) == [(True, [key(2), key(3)]), (False, [key(4), key(5)])]


def test_loading_block_is_never_evicted() -> None:
    m = CPUOffloadingManager(2)
    store(m, 1, 2)
    spec = m.prepare_load([key(2), key(1)], CTX)
    assert spec.block_ids == m.block_ids([key(2), key(1)])
    assert m.ref_count(key(1)) == 1
    # Both blocks pinned: no room, and nothing changes.
    assert m.prepare_store([key(3)], CTX) is None
    assert m.is_ready(key(1)) and m.is_ready(key(2))
    assert [e for e in m.take_events() if e.removed] == []
    # Unpin one: it becomes the victim even though it is not the oldest.
    m.complete_load([key(2)], CTX)
    out = m.prepare_store([key(3)], CTX)
    assert out is not None and out.evicted_keys == [key(2)]
    assert m.is_ready(key(1))
    m.complete_load([key(1)], CTX)
    assert m.ref_count(key(1)) == 0


def test_pins_count_per_load() -> None:
    m = CPUOffloadingManager(1)
    store(m, 1)
    m.prepare_load([key(1)], CTX)
    m.prepare_load([key(1)], ReqContext({"req": "b"}))
    m.complete_load([key(1)], CTX)
    assert m.prepare_store([key(2)], CTX) is None  # still pinned by the second load
    m.complete_load([key(1)], CTX)
    assert m.prepare_store([key(2)], CTX) is not None
    with pytest.raises(ValueError):
        m.complete_load([key(2)], CTX)  # pending, never loaded


def test_prepare_load_of_missing_or_pending_key_pins_nothing() -> None:
    m = CPUOffloadingManager(4)
    store(m, 1)
    m.prepare_store([key(2)], CTX)
    with pytest.raises(KeyError):
        m.prepare_load([key(1), key(2)], CTX)
    with pytest.raises(KeyError):
        m.prepare_load([key(1), key(9)], CTX)
    assert m.ref_count(key(1)) == 0
    with pytest.raises(ValueError):
        m.complete_load([key(1)], CTX)


def test_failed_store_frees_its_blocks() -> None:
    m = CPUOffloadingManager(2)
    assert store(m, 1, 2, success=False) == [key(1), key(2)]
    assert m.num_free_blocks == 2
    assert not m.lookup(key(1), CTX)
    assert list(m.take_events()) == []
    assert store(m, 1, 2) == [key(1), key(2)]  # can be stored again
    assert m.num_free_blocks == 0


def test_pending_and_requested_blocks_are_not_eviction_candidates() -> None:
    m = CPUOffloadingManager(3)
    store(m, 1, 2)
    assert m.prepare_store([key(3)], CTX) is not None  # pending, fills the pool
    # Room for 4 needs a victim: 3 is pending, 1 is part of this very request.
    out = m.prepare_store([key(1), key(4)], CTX)
    assert out is not None
    assert out.keys_to_store == [key(4)]
    assert out.evicted_keys == [key(2)]
    assert m.prepare_store([key(5), key(6), key(7), key(8)], CTX) is None


def test_complete_store_ignores_unknown_and_ready_keys() -> None:
    m = CPUOffloadingManager(2)
    store(m, 1)
    m.take_events()
    m.complete_store([key(1), key(7)], CTX)
    m.complete_store([key(1)], CTX, success=False)
    assert m.is_ready(key(1))
    assert list(m.take_events()) == []


def test_groups_are_separate_keys_and_recoverable_from_events() -> None:
    m = CPUOffloadingManager(4)
    digest = get_offload_block_hash(key(1))
    out = m.prepare_store([make_offload_key(digest, 0), make_offload_key(digest, 3)], CTX)
    assert out is not None and len(out.keys_to_store) == 2
    m.complete_store(out.keys_to_store, CTX)
    (ev,) = m.take_events()
    assert [get_offload_group_idx(k) for k in ev.keys] == [0, 3]
    assert {get_offload_block_hash(k) for k in ev.keys} == {digest}


def test_events_disabled_and_empty_pool() -> None:
    m = CPUOffloadingManager(1, enable_events=False)
    store(m, 1)
    store(m, 2)
    assert list(m.take_events()) == []
    empty = CPUOffloadingManager(0)
    assert empty.prepare_store([key(1)], CTX) is None
    out = empty.prepare_store([], CTX)
    assert out is not None and out.keys_to_store == []
    with pytest.raises(ValueError):
        CPUOffloadingManager(2, policy="fifo")


@pytest.mark.parametrize("policy", ["lru", "arc"])
def test_event_replay_reproduces_ready_set(policy: str) -> None:
    """After a random workload, replaying the events gives exactly the ready keys."""
    rng = random.Random(7)
    m = CPUOffloadingManager(16, policy=policy)
    replayed: set[OffloadKey] = set()
    pinned: list[list[OffloadKey]] = []

    def drain() -> None:
        for ev in m.take_events():
            assert isinstance(ev, OffloadingEvent)
            for k in ev.keys:
                if ev.removed:
                    assert k in replayed
                    replayed.discard(k)
                else:
                    assert k not in replayed
                    replayed.add(k)

    for _ in range(600):
        op = rng.random()
        keys = [key(rng.randrange(40), rng.randrange(2)) for _ in range(rng.randint(1, 5))]
        if op < 0.5:
            out = m.prepare_store(keys, CTX)
            if out is not None:
                m.complete_store(out.keys_to_store, CTX, success=rng.random() < 0.85)
        elif op < 0.7:
            ready = [k for k in keys if m.lookup(k, CTX)]
            if ready:
                m.prepare_load(ready, CTX)
                pinned.append(ready)
        elif op < 0.85 and pinned:
            m.complete_load(pinned.pop(rng.randrange(len(pinned))), CTX)
        else:
            m.touch(keys, CTX)
        if rng.random() < 0.3:
            drain()
        assert len(m.ready_keys()) + m.num_free_blocks <= 16
    drain()
    assert replayed == set(m.ready_keys())
    assert len(m.policy) == len(replayed)
