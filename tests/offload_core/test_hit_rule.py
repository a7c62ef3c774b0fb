"""The hybrid (HMA) hit rule (docs/design.md#hit-rule): hand-made cases and a brute force."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from schemas.hit_rule import (
    GroupAcceptor,
    GroupSpec,
    group_max_hit,
    hit_step,
    longest_hit,
    max_candidate,
)

FULL16 = GroupSpec("full_attention", 16)
SWA16_W32 = GroupSpec("sliding_window", 16, 32)  # needs ceil(31/16) = 2 blocks
MAMBA16 = GroupSpec("mamba", 16)


def blocks(n: int, missing: frozenset[int] | set[int] = frozenset()) -> list[bool]:
    return [i not in missing for i in range(n)]


# -- hand-made cases --------------------------------------------------------------------


def test_full_attention_only() -> None:
    assert longest_hit(100, [FULL16], [blocks(6, {4, 5})]) == 64
    assert longest_hit(100, [FULL16], [blocks(6)]) == 96
    assert longest_hit(100, [FULL16], [blocks(6, {0})]) == 0
    assert longest_hit(100, [FULL16], [[]]) == 0
    # A hole stops a full-attention prefix even when later blocks are cached.
    assert longest_hit(200, [FULL16], [blocks(10, {3})]) == 48


def test_request_tokens_minus_one_cap() -> None:
    # 64 tokens, all 4 blocks cached: the last token must be computed, so only 48.
    assert longest_hit(64, [FULL16], [blocks(4)]) == 48
    assert longest_hit(65, [FULL16], [blocks(4)]) == 64
    assert longest_hit(1, [FULL16], [blocks(4)]) == 0
    assert longest_hit(0, [FULL16], [blocks(4)]) == 0
    assert max_candidate(64, 16) == 48
    assert max_candidate(65, 16) == 64


def test_sliding_window_with_old_blocks_evicted_is_still_a_hit() -> None:
    full = blocks(8)
    swa = blocks(8, {0, 1, 2, 3})  # outside the 2-block window at p = 128
    assert longest_hit(129, [FULL16, SWA16_W32], [full, swa]) == 128


def test_hole_inside_the_window_pulls_back_to_last_intact_position() -> None:
    full = blocks(8)
    swa = blocks(8, {6})
    # e = 8 needs blocks 6,7; e = 7 needs 5,6; e = 6 needs 4,5 -> 96 tokens.
    assert longest_hit(129, [FULL16, SWA16_W32], [full, swa]) == 96
    # The hole at block 6 with blocks 0..3 evicted as well: still 96.
    assert longest_hit(129, [FULL16, SWA16_W32], [full, blocks(8, {0, 1, 2, 3, 6})]) == 96


def test_short_hit_needs_every_block_from_zero_in_a_window() -> None:
    # W = 64 with b = 16 -> 4 blocks. p = 32 (2 blocks) needs blocks 0 and 1.
    swa = GroupSpec("sliding_window", 16, 64)
    assert swa.window_blocks == 4
    assert longest_hit(33, [swa], [blocks(2, {0})]) == 0
    assert longest_hit(33, [swa], [blocks(2)]) == 32


def test_window_block_count() -> None:
    assert GroupSpec("sliding_window", 16, 1).window_blocks == 1
    assert GroupSpec("sliding_window", 16, 17).window_blocks == 1
    assert GroupSpec("sliding_window", 16, 18).window_blocks == 2
    assert GroupSpec("sliding_window", 16, 1024).window_blocks == 64
    # No window means no sliding rule: treated like full attention, the strict choice.
    assert GroupSpec("sliding_window", 16, None).rule == "full"
    assert GroupSpec("mla_attention", 16).rule == "full"
    assert GroupSpec("something_new", 16).rule == "full"


def test_mamba_checkpoints() -> None:
    full = blocks(8)
    states = [False] * 8
    states[1] = states[4] = True  # states end at 32 and 80 tokens
    assert longest_hit(129, [FULL16, MAMBA16], [full, states]) == 80
    states[7] = True
    assert longest_hit(129, [FULL16, MAMBA16], [full, states]) == 128
    # The cap takes the 128-token state out of reach.
    assert longest_hit(128, [FULL16, MAMBA16], [full, states]) == 80
    # Full attention shorter than the state: fall back to an earlier state.
    assert longest_hit(129, [FULL16, MAMBA16], [blocks(8, {3}), states]) == 32


def test_mixed_block_sizes_align_to_the_lcm() -> None:
    swa32 = GroupSpec("sliding_window", 32, 64)  # 2 blocks of 32
    assert hit_step([FULL16, swa32]) == 32
    # full: 11 blocks (176 tokens) -> aligned down to 160; swa fine up to 192.
    assert longest_hit(200, [FULL16, swa32], [blocks(11), blocks(6)]) == 160
    # hole at swa block 4 (tokens 128..160): e = 5 needs 3,4 -> e = 4 (128).
    assert longest_hit(200, [FULL16, swa32], [blocks(11), blocks(6, {4})]) == 128
    # lcm of 16 and 24 is 48.
    full24 = GroupSpec("full_attention", 24)
    assert hit_step([FULL16, full24]) == 48
    assert longest_hit(200, [FULL16, full24], [blocks(12), blocks(8)]) == 192
    assert longest_hit(200, [FULL16, full24], [blocks(11), blocks(8)]) == 144


def test_minimum_of_per_group_maxima_is_wrong() -> None:
    full = blocks(16, set(range(6, 16)))  # prefix of 6 blocks: 96 tokens
    swa = blocks(8, {0, 1, 4, 5})  # windows intact at e = 4 and e = 8
    limit = max_candidate(129, 16)
    per_group = [group_max_hit(FULL16, full, limit, 16), group_max_hit(SWA16_W32, swa, limit, 16)]
    assert per_group == [96, 128]
    # min(per_group) = 96, but at 96 the window (blocks 4, 5) is gone; the true hit is 64.
    assert longest_hit(129, [FULL16, SWA16_W32], [full, swa]) == 64


def test_acceptor_edges() -> None:
    acc = GroupAcceptor(SWA16_W32, blocks(3))
    assert acc.accepts(0)
    assert acc.accepts(3)
    assert not acc.accepts(4)  # beyond the known blocks is a miss
    assert longest_hit(100, [], []) == 0


# -- brute force straight from the rule's text (docs/design.md#hit-rule) -----------------


def _cached(c: list[bool], i: int) -> bool:
    return 0 <= i < len(c) and c[i]


def reference(request_tokens: int, groups: list[GroupSpec], cached: list[list[bool]]) -> int:
    """Largest p <= request_tokens - 1, multiple of the lcm, accepted by every group."""
    lcm = math.lcm(*(g.block_size for g in groups))
    best = 0
    for p in range(0, max(request_tokens, 0)):
        if p % lcm:
            continue
        ok = True
        for g, c in zip(groups, cached, strict=True):
            b = g.block_size
            ends = p // b  # blocks ending at b, 2b, ..., p
            if g.kind == "sliding_window":
                n = max(1, math.ceil((g.sliding_window - 1) / b))
                needed = range(max(0, ends - n), ends)  # last n blocks, or all from 0
            elif g.kind == "mamba":
                needed = range(ends - 1, ends) if p else range(0)
            else:
                needed = range(0, ends)
            ok = ok and all(_cached(c, i) for i in needed)
        if ok:
            best = p
    return best


@st.composite
def hybrid_cases(draw: st.DrawFn) -> tuple[int, list[GroupSpec], list[list[bool]]]:
    n_groups = draw(st.integers(1, 3))
    groups: list[GroupSpec] = []
    for _ in range(n_groups):
        kind = draw(st.sampled_from(["full_attention", "sliding_window", "mamba"]))
        b = draw(st.sampled_from([1, 2, 3, 4, 8]))
        window = draw(st.integers(1, 40)) if kind == "sliding_window" else None
        groups.append(GroupSpec(kind, b, window))
    request_tokens = draw(st.integers(0, 96))
    cached = []
    for g in groups:
        n = draw(st.integers(0, request_tokens // g.block_size + 2))
        # Mostly hits, so long hits and windows actually occur.
        cached.append(draw(st.lists(st.booleans() | st.just(True), min_size=n, max_size=n)))
    return request_tokens, groups, cached


@settings(max_examples=400, deadline=None)
@given(hybrid_cases())
def test_longest_hit_matches_brute_force(
    case: tuple[int, list[GroupSpec], list[list[bool]]],
) -> None:
    request_tokens, groups, cached = case
    assert longest_hit(request_tokens, groups, cached) == reference(request_tokens, groups, cached)


@settings(max_examples=200, deadline=None)
@given(hybrid_cases())
def test_group_max_hit_matches_brute_force(
    case: tuple[int, list[GroupSpec], list[list[bool]]],
) -> None:
    request_tokens, groups, cached = case
    step = hit_step(groups)
    limit = max_candidate(request_tokens, step)
    for g, c in zip(groups, cached, strict=True):
        expected = max(
            (p for p in range(0, limit + 1, step) if reference(p + 1, [g], [c]) == p), default=0
        )
        assert group_max_hit(g, c, limit, step) == expected
