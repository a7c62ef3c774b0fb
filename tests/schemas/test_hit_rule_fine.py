"""Partial-hash hits (``GroupSpec.block_units`` > 1) against vLLM 0.33's own lookup.

The oracle below restates, line by line, ``FullAttentionManager.find_longest_cache_hit``
in its fine-grained mode (phase 1: whole blocks, at most ``max_length // block_size``;
phase 2: the highest partial entry inside the next block, below its last unit and the
cap) and ``MambaManager``'s per-unit scan, joined as ``HybridKVCacheCoordinator`` joins a
simple hybrid (full attention first, mamba bounded by its answer).
"""

from __future__ import annotations

import random

import pytest

from schemas.hit_rule import GroupSpec, fine_reach, group_max_hit, longest_hit

UNIT = 16


def vllm_hit(n: int, full: list[bool], mamba: list[bool], k: int) -> int:
    max_length = n - 1
    hashes = n // UNIT  # the request's hash units
    blocks = 0
    while (
        blocks < max_length // (k * UNIT)
        and blocks * k + k - 1 < len(full)
        and full[blocks * k + k - 1]
    ):
        blocks += 1
    hit = blocks * k * UNIT
    first = blocks * k
    for idx in range(min(first + k - 1, max_length // UNIT, hashes) - 1, first - 1, -1):
        if idx < len(full) and full[idx]:
            hit = (idx + 1) * UNIT
            break
    for idx in range(min(hit // UNIT, hashes) - 1, -1, -1):
        if idx < len(mamba) and mamba[idx]:
            return (idx + 1) * UNIT
    return 0


@pytest.mark.parametrize("seed", range(8))
def test_fine_full_plus_mamba_matches_vllm(seed: int) -> None:
    rng = random.Random(seed)
    k = rng.choice([2, 4, 8])
    specs = [GroupSpec("full_attention", UNIT, None, k), GroupSpec("mamba", UNIT)]
    for _ in range(400):
        units = rng.randint(0, 40)
        dense = rng.random()
        full = [rng.random() < dense for _ in range(units)]
        # Block entries (at a block's last unit) are usually there; partials are sparse.
        for i in range(units):
            if i % k == k - 1:
                full[i] = rng.random() < 0.85
        mamba = [rng.random() < 0.3 for _ in range(rng.randint(0, 40))]
        n = rng.randint(1, 44 * UNIT)
        want = vllm_hit(n, full, mamba, k)
        got = longest_hit(n, specs, [bytes(map(bool, full)), bytes(map(bool, mamba))])
        assert got == want, (n, k, full, mamba)


def test_block_entry_never_serves_a_partial_hit() -> None:
    """A cached whole block past the cap is not probed: only partial entries are."""
    mask = bytes([0, 0, 0, 1, 0, 0, 0, 1])  # two whole blocks of 4 units, no partials
    assert fine_reach(mask, 4, cap_units=7) == 4
    assert fine_reach(mask, 4, cap_units=8) == 8
    with_partial = bytes([0, 0, 0, 1, 0, 1, 0, 1])
    assert fine_reach(with_partial, 4, cap_units=7) == 6
    assert fine_reach(with_partial, 4, cap_units=5) == 4  # the partial is past the cap


def test_group_max_hit_is_downward_closed_at_the_cap() -> None:
    spec = GroupSpec("full_attention", UNIT, None, 4)
    mask = bytes([0, 0, 0, 1, 0, 1, 0, 0])
    assert spec.rule == "fine"
    assert group_max_hit(spec, mask, 7 * UNIT, UNIT) == 6 * UNIT
    assert group_max_hit(spec, mask, 5 * UNIT, UNIT) == 4 * UNIT
