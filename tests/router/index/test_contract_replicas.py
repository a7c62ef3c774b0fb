"""The index contract across router replicas and restarts: what several routers sharing
one Redis (or a restarted one) must agree on. Runs like test_contract.py."""

from __future__ import annotations

from typing import Any

import pytest
from _kv_streams import EventSource, Harness, cleared, new_index, tokens, wire

from router.index.base import IndexUnavailable

W = "w1"
BS = 16


async def test_redis_restarted_router_serves_the_same_state(redis_url: str) -> None:
    """Redis only: a restarted router (new objects, same server) scores and ingests on."""
    src = EventSource("foreign")
    toks = tokens(10 * BS + 1)
    first = Harness.build(new_index("redis", redis_url))
    second = Harness.build(new_index("redis", redis_url))
    try:
        await first.feed(
            W,
            src.store(toks, BS, 0, 6, group=0, kind="full_attention"),
            src.store(toks, BS, 0, 6, group=1, kind="sliding_window", window=48),
        )
        before = await first.score(toks, [W])
        assert before.workers[0].hit_tokens == 96
        assert await second.score(toks, [W]) == before
        assert await second.ingestor.hash_mode(W) == "canonical"
        assert await second.ingestor.worker_groups(W) == await first.ingestor.worker_groups(W)
        # Parents and removals resolve through the persisted map.
        await second.feed(
            W, src.store(toks, BS, 6, 10, group=0), src.store(toks, BS, 6, 10, group=1)
        )
        await second.feed(W, src.remove(toks, BS, [2], group=1))
        assert second.ingestor.counters.unknown_parent == 0
        assert (await second.one(toks, W)).hit_tokens == 160
        await second.feed(W, src.remove(toks, BS, [8], group=1))
        assert (await second.one(toks, W)).hit_tokens == 128
        assert (await first.one(toks, W)).hit_tokens == 128
    finally:
        await first.index.close()
        await second.index.close()


async def test_each_published_batch_is_applied_once(make_harness: Any, backend_kind: str) -> None:
    """With copies counted, applying a batch twice would double its stores: the index
    records each (rank, seq) with its ops and skips one it has applied. Two replicas on
    one Redis ingesting the same stream count every copy once."""
    replicas = [make_harness()] + ([make_harness()] if backend_kind == "redis" else [])
    src = EventSource()
    toks = tokens(4 * BS + 1)
    store = wire(src.store(toks, BS, 0, 4))
    remove = wire(src.remove(toks, BS, [3]))
    for h in replicas:  # both replicas (or a retry) apply seq 0 and seq 1
        await h.ingestor.apply_batch(W, store, [(0, 0, 0, 11)])
        await h.ingestor.apply_batch(W, remove, [(0, 0, 1, 12)])
    first = replicas[0]
    # One copy of block 3 was stored, one removed: the block is gone.
    assert (await first.one(toks, W)).hit_tokens == 3 * BS
    assert await first.index.load_seqs(W) == {0: (1, 12)}
    skipped = sum(h.ingestor.counters.batches_skipped for h in replicas)
    assert skipped == 2 * (len(replicas) - 1)
    await first.ingestor.apply_batch(W, store, [(0, 0, 1, 12)])  # an old seq: skipped
    assert (await first.one(toks, W)).hit_tokens == 3 * BS
    # A resync starts over: seqs are forgotten with the entries.
    await first.ingestor.clear_worker(W)
    assert await first.index.load_seqs(W) == {}
    await first.ingestor.apply_batch(W, store, [(0, 0, 0, 11)])
    assert (await first.one(toks, W)).hit_tokens == 4 * BS


async def test_a_failed_redis_write_leaves_no_mapping_in_the_local_cache(redis_url: str) -> None:
    """The client-side resolve cache learns a mapping only once Redis took the write."""
    import redis as redis_sync

    from router.index.redis import worker_prefix

    h = Harness.build(new_index("redis", redis_url))
    src = EventSource()
    toks = tokens(2 * BS + 1)
    client = redis_sync.Redis.from_url(redis_url)
    client.set(worker_prefix(W) + "keys", "not a set")  # the APPLY script fails: WRONGTYPE
    with pytest.raises(redis_sync.exceptions.ResponseError):
        await h.ingestor.apply_batch(W, wire(src.store(toks, BS, 0, 2)))
    client.delete(worker_prefix(W) + "keys")
    hashes = src.hashes(toks, BS)
    assert await h.index.resolve(W, BS, hashes) == [None, None]
    await h.index.close()


async def test_another_replicas_clear_voids_this_replicas_resolve_cache(redis_url: str) -> None:
    """Two routers on one Redis: mappings one replica cached are not trusted once the
    other cleared the worker (a restart at another hash unit: the same engine hashes
    now name other keys) or removed and re-created it (issue 14, item 5)."""
    from router.index.base import GPU_BIT, GroupMeta, StoreOp, WorkerState
    from router.index.redis import StaleMappings

    a, b = new_index("redis", redis_url), new_index("redis", redis_url)
    groups = {0: GroupMeta("full_attention", BS)}
    await a.save_worker(W, WorkerState(dict(groups)))
    await a.apply(W, groups, [StoreOp(0, GPU_BIT, [11, 12], [101, 102])])
    assert await a.resolve(W, BS, [11, 12]) == [101, 102]

    await b.clear_worker(W)
    await b.apply(W, groups, [StoreOp(0, GPU_BIT, [11, 12], [201, 202])])
    # A resolve answered from the cache costs no round trip, so it may be stale...
    assert await a.resolve(W, BS, [11, 12]) == [101, 102]
    # ...but a write planned from it is refused atomically and writes nothing.
    with pytest.raises(StaleMappings):
        await a.apply(W, groups, [StoreOp(0, GPU_BIT, [13], [103])])
    assert await a.resolve(W, BS, [11, 12, 13]) == [201, 202, None]
    assert await a.resolve(W, BS, [11, 12]) == [201, 202]  # now cached under the new epoch
    await a.apply(W, groups, [StoreOp(0, GPU_BIT, [13], [103])])  # current: taken

    await b.remove_worker(W)
    await b.save_worker(W, WorkerState(dict(groups)))
    await b.apply(W, groups, [StoreOp(0, GPU_BIT, [11], [301])])
    with pytest.raises(StaleMappings):
        await a.apply(W, groups, [StoreOp(0, GPU_BIT, [14], [104])])
    assert await a.resolve(W, BS, [11, 12, 14]) == [301, None, None]
    await a.close()
    await b.close()


async def test_a_batch_planned_from_voided_mappings_is_refused_then_replanned(
    redis_url: str,
) -> None:
    """Replica A resolves a parent from its cache (no round trip); replica B has cleared
    the worker since and the same engine hashes now name other blocks. A's write is
    refused whole (``StaleMappings``, an ``IndexUnavailable``: the subscriber's writer
    retries), and the retry, planned from Redis, keys the block under its real parent."""
    from router.index.redis import StaleMappings

    a = Harness.build(new_index("redis", redis_url))
    b = Harness.build(new_index("redis", redis_url))
    old, new = tokens(3 * BS + 1, seed=1), tokens(3 * BS + 1, seed=2)
    # Same seed: the engine hands out the same hash values for other content (a restart).
    src_a, src_b = EventSource("foreign", seed=5), EventSource("foreign", seed=5)
    await a.feed(W, src_a.store(old, BS, 0, 2))
    await b.feed(W, cleared())
    await b.feed(W, src_b.store(new, BS, 0, 2))
    batch = wire(src_b.store(new, BS, 2, 3))  # parent: the hash A cached for `old`
    with pytest.raises(StaleMappings):
        await a.ingestor.apply_batch(W, batch)
    assert (await b.one(new, W)).hit_tokens == 2 * BS  # nothing of it was written
    await a.ingestor.apply_batch(W, batch)  # the writer's retry
    for h in (a, b):
        assert (await h.one(new, W)).hit_tokens == 3 * BS
        assert (await h.one(old, W)).hit_tokens == 0
    await a.index.close()
    await b.index.close()


async def test_a_streams_calls_of_one_worker_apply_in_order_or_not_at_all(redis_url: str) -> None:
    """One ``apply_many`` streams its calls; each carries the epoch its plan assumed. If a
    worker's call is refused (another replica cleared the worker), its later calls in the
    same stream are refused too -- even one that starts with a clear -- so none applies
    ahead of the refused batch's replan. And a call after the worker's own clear in the
    stream expects the clear's epoch, not the one before it (it is not refused)."""
    from router.index.base import GPU_BIT, ClearOp, GroupMeta, StoreOp, WorkerState
    from router.index.redis import StaleMappings

    a, b = new_index("redis", redis_url), new_index("redis", redis_url)
    groups = {0: GroupMeta("full_attention", BS)}
    await a.save_worker(W, WorkerState(dict(groups)))
    await a.apply(W, groups, [StoreOp(0, GPU_BIT, [11], [101])])
    await b.clear_worker(W)  # A's cached epoch is void now
    first = (W, groups, [StoreOp(0, GPU_BIT, [12], [102])])
    second = (W, groups, [ClearOp(), StoreOp(0, GPU_BIT, [13], [103])])
    with pytest.raises(StaleMappings):
        await a.apply_many([first, second])
    assert await b.resolve(W, BS, [11, 12, 13], live_only=True) == [None, None, None]
    # The replan (the writer's retry): both, in order -- the clear drops 102.
    got = await a.apply_many([first, second, (W, groups, [StoreOp(0, GPU_BIT, [14], [104])])])
    assert [r.stored for r in got] == [1, 1, 1]
    assert await b.resolve(W, BS, [12, 13, 14], live_only=True) == [None, 103, 104]
    await a.close()
    await b.close()


async def test_a_stream_replanned_after_another_replica_applied_its_clear_goes_through(
    redis_url: str,
) -> None:
    """Replicas ingesting one stream: B applied batch 1 (a clear, then stores) first. A's
    stream of batches 1 and 2 is refused once (its cached epoch predates B's clear); the
    retry's batch 1 is skipped by its seq -- so A's own clear in it never runs -- and
    batch 2 must still be taken: it may expect the epoch batch 1 left whether or not its
    clear ran (expecting only A's clear epoch refused it at every retry: a livelock)."""
    from router.index.base import GPU_BIT, ClearOp, GroupMeta, SeqOp, StoreOp, WorkerState
    from router.index.redis import StaleMappings

    a, b = new_index("redis", redis_url), new_index("redis", redis_url)
    groups = {0: GroupMeta("full_attention", BS)}
    await a.save_worker(W, WorkerState(dict(groups)))
    await a.apply(W, groups, [StoreOp(0, GPU_BIT, [11], [101])])  # A caches the epoch
    first = (W, groups, [SeqOp(0, 1, 7), ClearOp(), StoreOp(0, GPU_BIT, [12], [102])])
    second = (W, groups, [SeqOp(0, 2, 8), StoreOp(0, GPU_BIT, [13], [103])])
    await b.apply_many([first])
    with pytest.raises(StaleMappings):
        await a.apply_many([first, second])
    got = await a.apply_many([first, second])  # the writer's retry
    assert [(r.skipped_batches, r.stored) for r in got] == [(1, 0), (0, 1)]
    assert await b.resolve(W, BS, [11, 12, 13], live_only=True) == [None, 102, 103]
    assert await b.load_seqs(W) == {0: (2, 8)}
    await a.close()
    await b.close()


async def test_a_rebuild_is_not_overtaken_by_another_replicas_live_batch(
    make_harness: Any, backend_kind: str
) -> None:
    """Replica A clears the worker to rebuild it from the publisher's oldest batch;
    replica B, which did not clear, writes the next live batch meanwhile. Recorded first,
    B's seq made every batch of A's rebuild look applied (the history stayed missing),
    and its removal ran before the store it undoes. The index defers a batch whose
    predecessor is not the rank's last seq (``SeqOp.follows``); A applies it in order."""
    a = make_harness()
    b = Harness.build(a.index) if backend_kind == "memory" else make_harness()
    src = EventSource()
    toks = tokens(4 * BS + 1)
    stream = [  # (seq, batch): blocks 0-1, blocks 2-3, block 3 removed
        (0, wire(src.store(toks, BS, 0, 2))),
        (1, wire(src.store(toks, BS, 2, 4))),
        (2, wire(src.remove(toks, BS, [3]))),
    ]

    async def write(h: Harness, seq: int, follows: int) -> dict[str, int]:
        mark = [(0, 0, seq, seq, follows)]
        try:
            return await h.ingestor.apply_batch(W, stream[seq][1], mark)
        except IndexUnavailable:  # StaleMappings: planned before the clear; the writer replans
            return await h.ingestor.apply_batch(W, stream[seq][1], mark)

    for h in (a, b):
        assert await write(h, 0, -1) == {} and await write(h, 1, 0) == {}
    await a.ingestor.clear_worker(W)
    assert await write(b, 2, 1) == {W: -1}  # deferred: the index holds no seq now
    assert (await a.one(toks, W)).hit_tokens == 0  # and nothing of it was applied
    for seq, follows in ((0, -1), (1, 0), (2, 1)):  # A's rebuild, in order
        assert await write(a, seq, follows) == {}
    assert (await a.one(toks, W)).hit_tokens == 3 * BS
    keys = await a.index.resolve(W, BS, src.hashes(toks, BS)[:3])
    assert await a.index.copies(W, 0, [k for k in keys if k is not None]) == [1, 1, 1]
    assert await a.index.load_seqs(W) == {0: (2, 2)}
    assert b.ingestor.counters.batches_deferred == 1
    # Caught up: B's next batch follows the index's last seq and is applied.
    await b.ingestor.apply_batch(W, wire(src.remove(toks, BS, [2])), [(0, 0, 3, 3, 2)])
    assert (await a.one(toks, W)).hit_tokens == 2 * BS
    # A batch that names no predecessor (a 4-field mark) keeps the plain rule.
    await b.ingestor.apply_batch(W, wire(src.remove(toks, BS, [1])), [(0, 0, 9, 9)])
    assert (await a.one(toks, W)).hit_tokens == BS
