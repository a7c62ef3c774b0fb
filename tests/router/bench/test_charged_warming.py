"""Prefix-warming requests in the charged engine: each is a request of its own, admitted
FCFS behind what arrived meanwhile, and the request's hits count only what no request
of it prefilled."""

from __future__ import annotations

import pytest

from offload_core.kv_cache import KVCacheManager
from router.bench.charged import ChargedEngine, ChargedModel, EngineNotes, prefix_request
from schemas.hit_rule import GroupSpec

GROUPS = [GroupSpec("full_attention", 16)]
# 1 s per step, 1 s per prefill token, 64 tokens a step.
UNIT = ChargedModel(
    step_s=1.0, prefill_token_s=1.0, attn_s=0.0, kv_read_s=0.0, seq_s=0.0, max_batched_tokens=64
)
LONG = list(range(160))


def timeline(warm: tuple[int, ...]) -> tuple[dict[str, float], EngineNotes, ChargedEngine]:
    e = ChargedEngine(KVCacheManager(GROUPS, 64), UNIT)
    notes = EngineNotes()
    e.submit("long", 0.0, e.kv.make_request(LONG), 1, warm)
    e.run_until(0.5, notes)  # the first chunk is under way
    e.submit("turn", 0.5, e.kv.make_request(list(range(5000, 5010))), 1)
    e.run_until(float("inf"), notes)
    return {rid: ttft for _, rid, ttft in notes.first_tokens}, notes, e


def test_a_turn_is_served_between_warming_chunks() -> None:
    plain, _, _ = timeline(())
    # As sent: 64 + 64 tokens, then 32 with the turn's 10: the turn waits for it all.
    assert plain["turn"] == pytest.approx(65 + 65 + 43 - 0.5)
    warmed, notes, e = timeline((64, 128))
    # Warmed 64 at a time: the first 64-token request, then the turn (queued first)
    # beside the second warming request's first 54 tokens.
    assert warmed["turn"] == pytest.approx(65 + 65 - 0.5)
    assert warmed["long"] > plain["long"]  # the long prompt pays for it
    assert set(warmed) == {"long", "turn"}  # warming requests report no first token
    # Nothing was cached before: no hits, however many tokens the warming requests hit.
    assert sorted(notes.admitted) == [("long", 0, 0), ("turn", 0, 0)]
    assert not e.running and not e.waiting
    # The whole prompt is cached at the end, as if it had been sent at once.
    hit = e.kv.find_longest_cache_hit(e.kv.make_request([*LONG, 1]))
    assert hit.hit_tokens == 160


def test_a_cached_prefix_counts_once_and_warming_starts_past_it() -> None:
    e = ChargedEngine(KVCacheManager(GROUPS, 64), UNIT)
    notes = EngineNotes()
    e.submit("first", 0.0, e.kv.make_request(LONG[:64]), 1)
    e.run_until(float("inf"), notes)
    e.submit("long", 100.0, e.kv.make_request(LONG), 1, (128,))
    e.run_until(float("inf"), notes)
    assert notes.admitted[-1] == ("long", 64, 64)
    # 64 new tokens in the warming request, 32 in the request: two steps.
    assert notes.first_tokens[-1] == (100.0 + 65 + 33, "long", 98.0)


def test_prefix_request_keeps_the_block_hashes_of_the_prefix() -> None:
    kv = KVCacheManager(GROUPS, 64)
    full = kv.make_request(LONG)
    part = prefix_request(full, 64)
    assert list(part.token_ids) == LONG[:64]
    assert part.hashes == kv.make_request(LONG[:64]).hashes
