"""GPU block pool: prefix index per group, LRU-of-freed eviction, ref counts, events."""

from __future__ import annotations

import pytest

from offload_core.base import make_offload_key
from offload_core.block_pool import BlockPool, PoolExhaustedError, lora_id_for
from schemas import AllBlocksCleared, BlockRemoved, BlockStored, encode_batch
from schemas.hashing import block_hashes, external_hash
from schemas.hit_rule import GroupSpec
from schemas.wire import KVEventBatch

FULL = GroupSpec("full_attention", 4)
SWA = GroupSpec("sliding_window", 4, 8)
TOKENS = list(range(100, 124))  # 6 blocks of 4
DIGESTS = block_hashes(TOKENS, 4)


def _cache_chain(pool: BlockPool, group: int, first: int, count: int) -> list[int]:
    ids = pool.allocate(count)
    parent = DIGESTS[first - 1] if first else None
    pool.cache_blocks(
        group, ids, DIGESTS[first : first + count], parent, TOKENS[first * 4 : (first + count) * 4]
    )
    return ids


def test_cache_blocks_emits_one_stored_event_with_group_fields() -> None:
    pool = BlockPool(8, [FULL, SWA])
    ids = _cache_chain(pool, 1, 2, 2)
    (ev,) = pool.take_events()
    assert isinstance(ev, BlockStored)
    assert ev.block_hashes == [external_hash(d) for d in DIGESTS[2:4]]
    assert ev.parent_block_hash == external_hash(DIGESTS[1])
    assert ev.token_ids == TOKENS[8:16]
    assert (ev.block_size, ev.medium, ev.group_idx) == (4, "GPU", 1)
    assert ev.kv_cache_spec_kind == "sliding_window"
    assert ev.kv_cache_spec_sliding_window == 8
    assert pool.get_cached_block(make_offload_key(DIGESTS[2], 1)) == ids[0]
    # Same hash, other group: a different key, not cached.
    assert pool.get_cached_block(make_offload_key(DIGESTS[2], 0)) is None
    encode_batch(KVEventBatch(ts=0.0, events=[ev]))  # encodable as-is


def test_full_attention_group_omits_window_and_lora_fields_are_set() -> None:
    pool = BlockPool(4, [FULL])
    ids = pool.allocate(1)
    pool.cache_blocks(0, ids, DIGESTS[:1], None, TOKENS[:4], lora_name="sql")
    (ev,) = pool.take_events()
    assert ev.parent_block_hash is None
    assert ev.kv_cache_spec_kind == "full_attention"
    assert ev.kv_cache_spec_sliding_window is None
    assert ev.lora_name == "sql"
    assert ev.lora_id == lora_id_for("sql") and ev.lora_id > 0


def test_freed_blocks_stay_cached_until_their_slot_is_reused() -> None:
    pool = BlockPool(4, [FULL])
    ids = _cache_chain(pool, 0, 0, 2)
    pool.free(reversed(ids))
    pool.take_events()
    assert pool.num_free_blocks == 4
    assert pool.get_cached_block(make_offload_key(DIGESTS[0], 0)) == ids[0]
    # Two never-used blocks sit ahead of them in the free queue: no eviction yet.
    assert pool.eviction_candidates(2) == []
    pool.allocate(2)
    assert pool.take_events() == []
    assert pool.num_cached_blocks == 2
    # The next allocation reaches them: the tail block (freed first) goes first.
    assert pool.eviction_candidates(1) == [ids[1]]
    assert pool.allocate(1) == [ids[1]]
    (ev,) = pool.take_events()
    assert isinstance(ev, BlockRemoved)
    assert ev.block_hashes == [external_hash(DIGESTS[1])]
    assert (ev.medium, ev.group_idx) == ("GPU", 0)
    assert pool.get_cached_block(make_offload_key(DIGESTS[1], 0)) is None
    assert pool.get_cached_block(make_offload_key(DIGESTS[0], 0)) == ids[0]


def test_touch_rescues_a_free_cached_block_and_refreshes_its_recency() -> None:
    pool = BlockPool(3, [FULL])
    a, b, c = (_cache_chain(pool, 0, i, 1)[0] for i in range(3))
    pool.free([a, b, c])  # free order a, b, c: a is evicted first
    pool.touch([a])  # a hit: referenced again, leaves the free queue
    assert pool.num_free_blocks == 2
    assert pool.eviction_candidates(3) == [b, c]
    pool.free([a])  # a is now the most recently freed
    assert pool.eviction_candidates(3) == [b, c, a]


def test_ref_counts_keep_shared_blocks_out_of_the_free_queue() -> None:
    pool = BlockPool(2, [FULL])
    (a,) = _cache_chain(pool, 0, 0, 1)
    pool.touch([a])  # second user
    pool.free([a])
    assert pool.num_free_blocks == 1
    pool.free([a])
    assert pool.num_free_blocks == 2
    with pytest.raises(ValueError):
        pool.free([a])


def test_allocate_more_than_free_raises_and_changes_nothing() -> None:
    pool = BlockPool(2, [FULL])
    pool.allocate(1)
    with pytest.raises(PoolExhaustedError):
        pool.allocate(2)
    assert pool.num_free_blocks == 1


def test_evictions_across_groups_are_split_per_group_in_order() -> None:
    pool = BlockPool(4, [FULL, SWA])
    f = _cache_chain(pool, 0, 0, 2)
    s = _cache_chain(pool, 1, 0, 2)
    pool.free(list(f) + list(s))
    pool.take_events()
    pool.allocate(4)
    events = pool.take_events()
    assert [(type(e), e.group_idx, len(e.block_hashes)) for e in events] == [
        (BlockRemoved, 0, 2),
        (BlockRemoved, 1, 2),
    ]


def test_a_key_is_never_cached_twice() -> None:
    pool = BlockPool(4, [FULL])
    _cache_chain(pool, 0, 0, 1)
    ids = pool.allocate(1)
    with pytest.raises(ValueError):
        pool.cache_blocks(0, ids, DIGESTS[:1], None, TOKENS[:4])


def test_reset_clears_the_index_only_when_nothing_is_in_use() -> None:
    pool = BlockPool(4, [FULL])
    ids = _cache_chain(pool, 0, 0, 2)
    pool.take_events()
    assert pool.reset() is False
    pool.free(ids)
    assert pool.reset() is True
    assert pool.num_cached_blocks == 0
    assert pool.take_events() == [AllBlocksCleared()]
    # Reusing those slots later evicts nothing (they are no longer cached).
    pool.allocate(4)
    assert pool.take_events() == []


def test_block_meta_remembers_parent_and_tokens_for_re_announcement() -> None:
    pool = BlockPool(4, [FULL])
    ids = _cache_chain(pool, 0, 1, 2)
    meta = pool.blocks[ids[1]].meta
    assert meta is not None
    assert meta.parent == DIGESTS[1]
    assert meta.token_ids == tuple(TOKENS[8:12])
