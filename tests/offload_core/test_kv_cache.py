"""KV cache manager: the hybrid hit rule on real pool state, block tables, lower tier."""

from __future__ import annotations

import pytest

from offload_core.base import OffloadKey, make_offload_key
from offload_core.block_pool import BlockPool
from offload_core.groups import format_groups, parse_groups
from offload_core.kv_cache import KVCacheManager, RequestTooLargeError
from schemas import BlockRemoved, BlockStored
from schemas.hashing import block_hashes, external_hash


def evict(pool: BlockPool, keys: list[OffloadKey]) -> None:
    """Evict exactly ``keys`` from the pool (test helper; every block must be free)."""
    targets = {pool.get_cached_block(k) for k in keys}
    assert None not in targets
    others = [b for b in range(pool.num_blocks) if b not in targets]
    pool.touch(others)
    pool.free(pool.allocate(len(targets)))
    pool.free(others)
    for k in keys:
        assert k not in pool


def keys(tokens: list[int], size: int, group: int, idx: list[int]) -> list[OffloadKey]:
    digests = block_hashes(tokens, size)
    return [make_offload_key(digests[i], group) for i in idx]


def test_full_attention_repeat_hits_all_but_the_last_token() -> None:
    kv = KVCacheManager(parse_groups("full:4"), 32)
    prompt = list(range(30))
    assert kv.process(prompt).hit_tokens == 0
    assert kv.process(prompt).hit_tokens == 28
    assert kv.process([*prompt, 99, 98]).hit_tokens == 28
    assert kv.process(prompt[:10]).hit_tokens == 8
    assert kv.process([1, *prompt]).hit_tokens == 0


def test_cap_at_request_tokens_minus_one() -> None:
    kv = KVCacheManager(parse_groups("full:4"), 8)
    kv.process(list(range(8)))
    # All 8 tokens are cached, but the last one must be computed: hit 4, not 8.
    assert kv.process(list(range(8))).hit_tokens == 4
    assert kv.process(list(range(9))).hit_tokens == 8
    assert kv.process([5]).hit_tokens == 0


def test_sliding_window_old_blocks_evicted_still_hit() -> None:
    kv = KVCacheManager(parse_groups("full:4,swa:4:8"), 64)
    prompt = list(range(33))
    kv.process(prompt)
    # Window 8 tokens = 2 blocks of 4: blocks 0..5 left the window and were freed first.
    old = keys(prompt, 4, 1, list(range(6)))
    freed_first = [kv.pool.get_cached_block(k) for k in reversed(old)]
    assert kv.pool.eviction_candidates(64)[:6] == freed_first
    evict(kv.pool, old)
    hit = kv.find_longest_cache_hit(prompt)
    assert hit.hit_tokens == 32
    assert hit.cached[1][:6] == [False] * 6


def test_a_hole_inside_the_window_pulls_the_hit_back() -> None:
    kv = KVCacheManager(parse_groups("full:4,swa:4:8"), 64)
    prompt = list(range(33))
    kv.process(prompt)
    evict(kv.pool, keys(prompt, 4, 1, [7]))
    # p=32 needs SWA blocks 6,7; p=28 needs 5,6 (still cached though out of window).
    assert kv.find_longest_cache_hit(prompt).hit_tokens == 28
    evict(kv.pool, keys(prompt, 4, 1, [0, 1, 2, 3, 4, 5]))
    assert kv.find_longest_cache_hit(prompt).hit_tokens == 0
    # The full-attention group alone would have allowed 32: not min of per-group maxima.
    assert kv.find_longest_cache_hit(prompt).cached[0] == [True] * 8


def test_swa_hit_takes_only_the_window_blocks() -> None:
    kv = KVCacheManager(parse_groups("full:4,swa:4:8"), 64)
    prompt = list(range(33))
    kv.process(prompt)
    plan = kv.begin(prompt)
    assert plan.hit_tokens == 32
    assert sorted(plan.groups[0].blocks) == list(range(8))
    assert sorted(plan.groups[1].blocks) == [6, 7]  # older blocks are not needed
    assert sorted(plan.groups[1].pending) == [8]  # the partial last block
    kv.allocate(plan)
    kv.commit(plan)
    kv.finish(plan)
    assert kv.pool.num_free_blocks == 64


def test_mamba_hits_only_at_a_checkpoint() -> None:
    kv = KVCacheManager(parse_groups("full:4,mamba:4"), 64)
    a = list(range(22))  # checkpoint left at 20 (5 blocks)
    kv.process(a)
    assert kv.find_longest_cache_hit(a).hit_tokens == 20
    assert kv.find_longest_cache_hit([*a, 7, 7, 7]).hit_tokens == 20
    # Full attention has blocks up to 16 for this prefix, but no mamba state at 4..16.
    assert kv.find_longest_cache_hit([*a[:17], 1000, 1001]).hit_tokens == 0
    plan = kv.begin([*a, 7, 7, 7])
    assert plan.groups[1].blocks.keys() == {4}  # the state at the hit
    assert plan.groups[1].pending == {5: None}  # the new checkpoint at 24
    kv.allocate(plan)
    kv.commit(plan)
    kv.finish(plan)
    stored = [e for e in kv.pool.take_events() if isinstance(e, BlockStored) and e.group_idx == 1]
    assert stored[-1].block_hashes == [external_hash(block_hashes([*a, 7, 7, 7], 4)[5])]
    assert stored[-1].kv_cache_spec_kind == "mamba"


def test_mixed_block_sizes_align_to_the_lcm() -> None:
    kv = KVCacheManager(parse_groups("full:4,swa:8:16"), 64)
    prompt = list(range(30))
    kv.process(prompt)
    hit = kv.find_longest_cache_hit(prompt)
    # full:4 alone would give 28; the lcm (8) and SWA blocks of 8 give 24.
    assert hit.hit_tokens == 24
    assert len(hit.cached[0]) == 6 and len(hit.cached[1]) == 3


def test_lower_tier_blocks_count_and_are_loaded_back_and_restored_on_gpu() -> None:
    kv = KVCacheManager(parse_groups("full:4"), 16)
    prompt = list(range(17))
    kv.process(prompt)
    kv.pool.take_events()
    offloaded = keys(prompt, 4, 0, [1, 2])
    evict(kv.pool, offloaded)
    kv.pool.take_events()
    lower = set(offloaded)
    hit = kv.find_longest_cache_hit(prompt, lower.__contains__)
    assert (hit.hit_tokens, hit.gpu_hit_tokens) == (16, 4)
    plan = kv.begin(prompt, lower.__contains__)
    kv.allocate(plan)
    assert [k for k, _ in plan.loads()] == offloaded
    assert {bid for _, bid in plan.loads()} == {plan.groups[0].blocks[1], plan.groups[0].blocks[2]}
    assert plan.computed() == []  # blocks 0 and 3 are reused, 4 is partial
    kv.commit(plan)
    kv.finish(plan)
    (stored,) = [e for e in kv.pool.take_events() if isinstance(e, BlockStored)]
    digests = block_hashes(prompt, 4)
    assert stored.block_hashes == [external_hash(d) for d in digests[1:3]]
    assert stored.parent_block_hash == external_hash(digests[0])
    assert all(k in kv.pool for k in offloaded)


def test_beyond_the_hit_cached_blocks_are_reused_not_duplicated() -> None:
    kv = KVCacheManager(parse_groups("full:4,swa:4:4"), 64)
    prompt = list(range(24))
    kv.process(prompt)
    # Window of 1 block: p=20 needs SWA block 4; without it the hit falls back to 16.
    evict(kv.pool, keys(prompt, 4, 1, [4]))
    kv.pool.take_events()
    plan = kv.process(prompt)
    assert plan.hit_tokens == 16
    events = kv.pool.take_events()
    # Full blocks 4, 5 and SWA block 5 were still cached: reused, only SWA 4 is re-stored.
    stored = [e for e in events if isinstance(e, BlockStored)]
    assert [(e.group_idx, len(e.block_hashes)) for e in stored] == [(1, 1)]
    assert not any(isinstance(e, BlockRemoved) for e in events)


def test_too_large_a_prompt_is_refused_without_side_effects() -> None:
    kv = KVCacheManager(parse_groups("full:4,swa:4:8"), 8)
    kv.process(list(range(12)))
    before = kv.pool.eviction_candidates(8)
    with pytest.raises(RequestTooLargeError):
        kv.begin(list(range(40)))
    assert kv.pool.eviction_candidates(8) == before
    assert kv.pool.num_free_blocks == 8


def test_cache_salt_and_lora_separate_prefixes() -> None:
    kv = KVCacheManager(parse_groups("full:4"), 64)
    prompt = list(range(17))
    kv.process(prompt, cache_salt="a")
    assert kv.process(prompt).hit_tokens == 0
    assert kv.process(prompt, cache_salt="a").hit_tokens == 16
    assert kv.process(prompt, cache_salt="b").hit_tokens == 0
    kv.process(prompt, lora_name="x")
    assert kv.process(prompt, lora_name="x").hit_tokens == 16
    stored = [e for e in kv.pool.take_events() if isinstance(e, BlockStored)]
    assert stored[0].extra_keys is not None and stored[0].extra_keys[0] == (("cache_salt", "a"),)
    assert stored[-1].lora_name == "x"


def test_plan_steps_must_run_in_order() -> None:
    kv = KVCacheManager(parse_groups("full:4"), 8)
    plan = kv.begin(list(range(9)))
    with pytest.raises(RuntimeError):
        kv.commit(plan)


def test_group_specs_parse_to_vllm_kind_names_and_back() -> None:
    groups = parse_groups("full:16, swa:16:1024,mamba:16,mla:32")
    assert [(g.kind, g.block_size, g.sliding_window) for g in groups] == [
        ("full_attention", 16, None),
        ("sliding_window", 16, 1024),
        ("mamba", 16, None),
        ("mla_attention", 32, None),
    ]
    assert [g.rule for g in groups] == ["full", "sliding", "mamba", "full"]
    assert format_groups(groups) == "full:16,swa:16:1024,mamba:16,mla:32"


@pytest.mark.parametrize(
    "text", ["", "full", "full:0", "full:x", "swa:16", "swa:16:0", "lstm:16", "full:16:4"]
)
def test_bad_group_specs_are_rejected_with_a_clear_error(text: str) -> None:
    with pytest.raises(ValueError):
        parse_groups(text)
