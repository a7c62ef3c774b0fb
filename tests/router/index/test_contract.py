"""The index contract: every test runs against memory and redis (see conftest.py)."""

from __future__ import annotations

import pytest
from _kv_streams import EventSource, Harness, cleared, tokens

from router.index import make_index

W = "w1"
BS = 16


async def test_copies_are_counted_and_the_last_copy_removes(harness: Harness) -> None:
    """vLLM keeps duplicate blocks: each store of a held (group, hash) is one more copy,
    each BlockRemoved takes one, and the block stays hittable until its last copy goes."""
    src = EventSource()
    toks = tokens(10 * BS + 1)
    await harness.feed(W, src.store(toks, BS, 0, 10))
    await harness.feed(W, src.store(toks, BS, 0, 10), src.store(toks, BS, 0, 4))
    c = harness.ingestor.counters
    assert (c.blocks_stored, c.blocks_stored_repeat) == (10, 14)
    assert (await harness.one(toks, W)).hit_tokens == 10 * BS

    # Blocks 6-7 have two copies: one removal each leaves them cached.
    await harness.feed(W, src.remove(toks, BS, [6, 7]))
    assert (c.blocks_removed, c.blocks_removed_missing) == (2, 0)
    assert (await harness.one(toks, W)).hit_tokens == 10 * BS
    assert (await harness.ingestor.worker_groups(W))[0].blocks_by_medium == {"GPU": 10}
    # The last copies go: the prefix stops at block 6; a third removal finds nothing.
    await harness.feed(W, src.remove(toks, BS, [6, 7]), src.remove(toks, BS, [6, 7]))
    assert (c.blocks_removed, c.blocks_removed_missing) == (4, 2)
    assert (await harness.one(toks, W)).hit_tokens == 6 * BS
    assert (await harness.ingestor.worker_groups(W))[0].blocks_by_medium == {"GPU": 8}
    stats = await harness.index.stats()
    assert stats["entries"] == 8 and stats["workers"] == 1
    # Blocks 0-3 were stored three times: three removals to forget them.
    for _ in range(2):
        await harness.feed(W, src.remove(toks, BS, [0]))
    assert (await harness.one(toks, W)).hit_tokens == 6 * BS
    await harness.feed(W, src.remove(toks, BS, [0]))
    assert (await harness.one(toks, W)).hit_tokens == 0


async def test_copies_are_read_per_worker_and_medium(harness: Harness) -> None:
    """``IndexBackend.copies`` (what the re-announcement check reads) for a worker that is
    not the first one registered, per medium."""
    from router.index.base import CPU_BIT, GPU_BIT

    src = EventSource()
    toks = tokens(4 * BS + 1)
    await harness.feed("w0", src.store(toks, BS, 0, 4))  # takes the first slot
    await harness.feed(W, src.store(toks, BS, 0, 4), src.store(toks, BS, 0, 2))
    await harness.feed(W, src.store(toks, BS, 0, 3, medium="CPU"))
    keys = await harness.index.resolve(W, BS, src.hashes(toks, BS))
    assert None not in keys
    index = harness.index
    assert await index.copies(W, 0, keys, GPU_BIT) == [2, 2, 1, 1]  # type: ignore[arg-type]
    assert await index.copies(W, 0, keys, CPU_BIT) == [1, 1, 1, 0]  # type: ignore[arg-type]
    assert await index.copies("w0", 0, keys, GPU_BIT) == [1, 1, 1, 1]  # type: ignore[arg-type]
    assert await index.copies("nobody", 0, keys, GPU_BIT) == [0, 0, 0, 0]  # type: ignore[arg-type]


async def test_media_are_tracked_per_block(harness: Harness) -> None:
    src = EventSource()
    toks = tokens(10 * BS + 1)
    await harness.feed(W, src.store(toks, BS, 0, 10), src.store(toks, BS, 0, 10, medium="CPU"))
    await harness.feed(W, src.remove(toks, BS, range(5, 10)))
    got = await harness.one(toks, W)
    assert (got.hit_tokens, got.hit_tokens_gpu) == (160, 80)
    assert got.score == pytest.approx(160 * (5 * 1.0 + 5 * 0.8) / 10)
    groups = await harness.ingestor.worker_groups(W)
    assert groups[0].blocks_by_medium == {"GPU": 5, "CPU": 10}

    await harness.feed(W, src.remove(toks, BS, range(10), medium="CPU"))
    got = await harness.one(toks, W)
    assert (got.hit_tokens, got.hit_tokens_gpu) == (80, 80)
    assert (await harness.ingestor.worker_groups(W))[0].blocks_by_medium == {"GPU": 5}


async def test_tokenless_offload_store_resolves_through_the_map(harness: Harness) -> None:
    """vLLM's offloading connector announces CPU blocks with no tokens and no parent."""
    src = EventSource()
    toks = tokens(8 * BS + 1)
    await harness.feed(W, src.store(toks, BS, 0, 8))
    await harness.feed(W, src.store(toks, BS, 0, 8, medium="CPU", with_tokens=False))
    await harness.feed(W, src.remove(toks, BS, range(8)))
    got = await harness.one(toks, W)
    assert (got.hit_tokens, got.hit_tokens_gpu, got.score) == (128, 0, pytest.approx(102.4))
    # A token-less store of blocks the map never saw cannot be placed: counted.
    other = tokens(4 * BS, seed=9)
    await harness.feed(W, src.store(other, BS, 0, 4, medium="CPU", with_tokens=False))
    assert harness.ingestor.counters.unresolved_blocks == 4


async def test_all_blocks_cleared_drops_entries_keeps_worker(harness: Harness) -> None:
    src = EventSource()
    toks = tokens(6 * BS + 1)
    await harness.feed(W, src.store(toks, BS, 0, 6, group=0, kind="full_attention"))
    assert await harness.ingestor.hash_mode(W) == "engine"
    await harness.feed(W, cleared())
    got = await harness.one(toks, W)
    assert (got.hit_tokens, got.learned) == (0, True)
    groups = await harness.ingestor.worker_groups(W)
    assert groups[0].kind == "full_attention" and groups[0].blocks_by_medium == {}
    assert await harness.ingestor.hash_mode(W) == "unknown"
    assert (await harness.index.stats())["entries"] == 0
    # The worker fills again from scratch.
    await harness.feed(W, src.store(toks, BS, 0, 3))
    assert (await harness.one(toks, W)).hit_tokens == 48


async def test_clear_worker_and_remove_worker(harness: Harness) -> None:
    src = EventSource()
    toks = tokens(4 * BS + 1)
    for w in ("a", "b"):
        await harness.feed(w, src.store(toks, BS, 0, 4))
    await harness.ingestor.clear_worker("a")
    assert (await harness.one(toks, "a")).hit_tokens == 0
    assert await harness.index.known_workers() == ["a", "b"]
    await harness.ingestor.remove_worker("b")
    assert await harness.index.known_workers() == ["a"]
    gone = await harness.one(toks, "b")
    assert (gone.learned, gone.hit_tokens) == (False, 0)
    assert await harness.ingestor.worker_groups("b") == {}
    assert (await harness.index.stats())["entries"] == 0


async def test_hybrid_full_plus_swa_old_window_evicted_still_hits(harness: Harness) -> None:
    src = EventSource()
    toks = tokens(20 * BS + 1)
    await harness.feed(
        W,
        src.store(toks, BS, 0, 20, group=0, kind="full_attention"),
        src.store(toks, BS, 0, 20, group=1, kind="sliding_window", window=64),
    )
    await harness.feed(W, src.remove(toks, BS, range(10), group=1))
    got = await harness.one(toks, W)
    assert got.hit_tokens == 320  # the window (4 blocks ending at 320) is intact
    # A hole inside the window pulls the hit back to the last intact window.
    await harness.feed(W, src.remove(toks, BS, [18], group=1))
    got = await harness.one(toks, W)
    assert (got.hit_tokens, got.hit_tokens_gpu) == (288, 288)
    assert [(g.group_idx, g.kind, g.hit_tokens) for g in got.groups] == [
        (0, "full_attention", 320),
        (1, "sliding_window", 288),
    ]


async def test_hybrid_mamba_needs_a_state_at_the_hit(harness: Harness) -> None:
    src = EventSource()
    toks = tokens(20 * BS + 1)
    await harness.feed(
        W,
        src.store(toks, BS, 0, 20, group=0, kind="full_attention"),
        src.store(toks, BS, 0, 20, group=1, kind="mamba"),
    )
    await harness.feed(W, src.remove(toks, BS, [i for i in range(20) if i not in (7, 11)], group=1))
    assert (await harness.one(toks, W)).hit_tokens == 192
    await harness.feed(W, src.remove(toks, BS, [11], group=1))
    assert (await harness.one(toks, W)).hit_tokens == 128


async def test_hybrid_cpu_offloaded_window_counts_only_in_hit_tokens(harness: Harness) -> None:
    src = EventSource()
    toks = tokens(12 * BS + 1)
    await harness.feed(
        W,
        src.store(toks, BS, 0, 12, group=0, kind="full_attention"),
        src.store(toks, BS, 0, 12, group=1, kind="sliding_window", window=33),
        src.store(toks, BS, 8, 12, group=1, medium="CPU", with_tokens=False),
    )
    await harness.feed(W, src.remove(toks, BS, range(8, 12), group=1))  # window left the GPU
    got = await harness.one(toks, W)
    assert (got.hit_tokens, got.hit_tokens_gpu) == (192, 128)
    # The hit needs 12 full-attention blocks (GPU) and the 2 window blocks (CPU).
    assert got.score == pytest.approx(192 * (12 + 2 * 0.8) / 14, abs=1e-3)


@pytest.mark.parametrize(
    ("mode", "algo", "expected"),
    [
        ("engine", "sha256", "engine"),
        ("engine", "sha256_cbor", "engine"),
        ("foreign", "", "canonical"),
    ],
)
async def test_both_hash_modes_score_exactly(
    harness: Harness, mode: str, algo: str, expected: str
) -> None:
    src = EventSource(mode, algo=algo or "sha256", seed=3)
    toks = tokens(12 * BS + 5)
    assert await harness.ingestor.hash_mode(W) == "unknown"
    await harness.feed(W, src.store(toks, BS, 0, 4), src.store(toks, BS, 4, 9))
    await harness.feed(W, src.store(toks, BS, 9, 12))
    assert await harness.ingestor.hash_mode(W) == expected
    assert (await harness.one(toks, W)).hit_tokens == 192
    assert (await harness.one(toks[:100], W)).hit_tokens == 96
    await harness.feed(W, src.remove(toks, BS, [5]))
    assert (await harness.one(toks, W)).hit_tokens == 80
    other = toks[:32] + tokens(64, seed=4)
    assert (await harness.one(other, W)).hit_tokens == 32


async def test_unknown_parent_is_counted_not_guessed(harness: Harness) -> None:
    src = EventSource("foreign")
    toks = tokens(8 * BS + 1)
    await harness.feed(W, src.store(toks, BS, 5, 8))
    assert harness.ingestor.counters.unknown_parent == 3
    assert (await harness.index.stats())["entries"] == 0
    assert (await harness.one(toks, W)).hit_tokens == 0


async def test_groups_of_one_block_size_share_the_map(harness: Harness) -> None:
    src = EventSource()
    toks = tokens(4 * BS + 1)
    await harness.feed(
        W,
        src.store(toks, BS, 0, 4, group=0, kind="full_attention"),
        src.store(toks, BS, 0, 4, group=1, kind="sliding_window", window=32),
    )
    await harness.feed(W, src.remove(toks, BS, [0, 1], group=1))
    await harness.feed(W, src.remove(toks, BS, [0, 1], group=0))
    c = harness.ingestor.counters
    assert (c.blocks_removed, c.blocks_removed_missing) == (4, 0)
    assert (await harness.index.stats())["map_entries"] == 2


async def test_lora_and_cache_salt_are_exact(harness: Harness) -> None:
    src = EventSource()
    toks = tokens(4 * BS + 1)
    await harness.feed("salted", src.store(toks, BS, 0, 4, salt="tenant-a"))
    await harness.feed("lora", src.store(toks, BS, 0, 2, lora=("sql", "/adapters/sql")))
    await harness.feed("lora", src.store(toks, BS, 2, 4, lora=("sql", "/adapters/sql")))
    ws = ["salted", "lora"]
    plain = {w.worker_id: w.hit_tokens for w in (await harness.score(toks, ws)).workers}
    assert plain == {"salted": 0, "lora": 0}
    salted = await harness.score(toks, ws, cache_salt="tenant-a")
    assert {w.worker_id: w.hit_tokens for w in salted.workers} == {"salted": 64, "lora": 0}
    wrong = await harness.score(toks, ws, cache_salt="tenant-b")
    assert all(w.hit_tokens == 0 for w in wrong.workers)
    lora = await harness.score(toks, ws, lora_name="sql")
    assert {w.worker_id: w.hit_tokens for w in lora.workers} == {"salted": 0, "lora": 64}


async def test_bad_events_are_counted_and_change_nothing(harness: Harness) -> None:
    src = EventSource()
    toks = tokens(4 * BS + 1)
    bad_medium = src.store(toks, BS, 0, 4, medium="TAPE")
    short = src.store(toks, BS, 0, 4)
    short.token_ids = short.token_ids[:-1]
    await harness.feed(W, bad_medium, short)
    assert harness.ingestor.counters.bad_events == 2
    assert (await harness.index.stats())["entries"] == 0
    assert (await harness.one(toks, W)).hit_tokens == 0


async def test_unknown_and_partially_learned_workers_are_reported(harness: Harness) -> None:
    src = EventSource()
    toks = tokens(4 * BS + 1)
    await harness.feed("gap", src.store(toks, BS, 0, 4, group=1, kind="full_attention"))
    await harness.feed("ok", src.store(toks, BS, 0, 2))
    res = await harness.score(toks, ["never", "gap", "ok", "never"])
    assert [w.worker_id for w in res.workers] == ["ok", "gap", "never"]
    by = {w.worker_id: w for w in res.workers}
    assert (by["ok"].hit_tokens, by["ok"].learned) == (32, True)
    assert (by["never"].learned, by["never"].hit_tokens) == (False, 0)
    assert by["gap"].learned is False and by["gap"].hit_tokens == 0
    assert [(g.group_idx, g.learned) for g in by["gap"].groups] == [(0, False), (1, True)]


async def test_offload_store_of_a_known_block_needs_no_parent(harness: Harness) -> None:
    """Our engine re-links CPU stores into chains; a parent evicted from every tier
    must not hide a child the map still names."""
    src = EventSource()
    toks = tokens(5 * BS + 1)
    await harness.feed(W, src.store(toks, BS, 0, 5))
    await harness.feed(W, src.remove(toks, BS, [2]))  # gone everywhere: map entry dropped
    await harness.feed(W, src.store(toks, BS, 3, 4, medium="CPU"))
    c = harness.ingestor.counters
    assert (c.unknown_parent, c.blocks_stored) == (0, 6)
    assert (await harness.ingestor.worker_groups(W))[0].blocks_by_medium == {"GPU": 4, "CPU": 1}
    # A parent never announced cannot be named: counted, not guessed.
    orphan = src.store(toks, BS, 3, 4, medium="CPU")
    orphan.block_hashes, orphan.parent_block_hash = [12345], 999
    await harness.feed(W, orphan)
    assert c.unknown_parent == 1


async def test_parent_gone_from_every_tier_still_names_its_children(harness: Harness) -> None:
    """A sliding-window request chains new blocks from an out-of-window parent evicted
    long ago: the mapping of removed blocks (ghosts) still names it."""
    src = EventSource()
    toks = tokens(8 * BS + 1)
    await harness.feed(W, src.store(toks, BS, 0, 4))
    await harness.feed(W, src.remove(toks, BS, range(4)))
    assert (await harness.index.stats())["map_entries"] == 0
    await harness.feed(W, src.store(toks, BS, 4, 8))
    assert harness.ingestor.counters.unknown_parent == 0
    assert (await harness.one(toks, W)).hit_tokens == 0  # blocks 0-3 are gone
    await harness.feed(W, src.store(toks, BS, 0, 4))
    assert (await harness.one(toks, W)).hit_tokens == 128


async def test_ghost_mappings_are_bounded_in_two_generations(
    backend_kind: str, request: pytest.FixtureRequest
) -> None:
    url = request.getfixturevalue("redis_url") if backend_kind == "redis" else None
    h = Harness.build(make_index(backend_kind, url, ghost_entries=2))
    src = EventSource()
    toks = tokens(6 * BS + 1)
    try:
        await h.feed(W, src.store(toks, BS, 0, 6))
        for i in range(4):  # ghosts: {0, 1} -> older generation, then {2, 3} replaces it
            await h.feed(W, src.remove(toks, BS, [i]))
        await h.feed(W, src.store(toks, BS, 2, 3))  # parent 1 forgotten
        await h.feed(W, src.store(toks, BS, 3, 4))  # parent 2 remembered
        assert h.ingestor.counters.unknown_parent == 1
        groups = await h.ingestor.worker_groups(W)
        assert groups[0].blocks_by_medium == {"GPU": 3}
    finally:
        await h.index.close()


async def test_ghost_generations_roll_inside_one_removal(
    backend_kind: str, request: pytest.FixtureRequest
) -> None:
    """One removal leaving more blocks than a generation holds rolls generations at the
    same mappings as one-by-one removals would (redis writes ghosts in chunks)."""
    url = request.getfixturevalue("redis_url") if backend_kind == "redis" else None
    h = Harness.build(make_index(backend_kind, url, ghost_entries=3))
    src = EventSource()
    toks = tokens(9 * BS + 1)
    try:
        await h.feed(W, src.store(toks, BS, 0, 9))
        # ghosts {0,1,2} -> older, {3,4,5} replace them as older, {6} is the newer one
        await h.feed(W, src.remove(toks, BS, range(7)))
        await h.feed(W, src.store(toks, BS, 3, 4))  # parent 2 forgotten
        assert h.ingestor.counters.unknown_parent == 1
        await h.feed(W, src.store(toks, BS, 5, 6))  # parent 4: older generation
        await h.feed(W, src.store(toks, BS, 7, 8))  # parent 6: newer generation
        assert h.ingestor.counters.unknown_parent == 1
    finally:
        await h.index.close()


async def test_engine_hashes_of_mixed_widths_in_one_op(harness: Harness) -> None:
    """Signed (negative) int hashes encode wider than 64-bit ones: one op mixing them
    takes redis's one-argument-per-hash path; both backends agree on the outcome."""
    src = EventSource()
    toks = tokens(4 * BS + 1)
    ev = src.store(toks, BS, 0, 4)
    ev.block_hashes = [-5, 7, -123_456_789, 2**63 + 1]
    await harness.feed(W, ev)
    assert (await harness.one(toks, W)).hit_tokens == 64
    gone = src.remove(toks, BS, [3])
    gone.block_hashes = [2**63 + 1, -1]  # -1 was never stored
    await harness.feed(W, gone)
    assert (await harness.one(toks, W)).hit_tokens == 48
    assert harness.ingestor.counters.blocks_removed_missing == 1
    child = src.store(toks, BS, 3, 4)
    child.block_hashes, child.parent_block_hash = [99], -123_456_789
    await harness.feed(W, child)
    assert (await harness.one(toks, W)).hit_tokens == 64
    assert harness.ingestor.counters.unknown_parent == 0
