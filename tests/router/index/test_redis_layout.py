"""The Redis index's inverted layout (``router.index.redis_lua`` / ``redis_read``): what the
contract suite cannot see from outside -- slots of removed workers are reused without
stale rows, the metadata a replica caches follows another replica's changes, a prefix
every worker holds comes back as one holders string, and shards merge exactly."""

from __future__ import annotations

import random

import pytest
import redis
from _kv_streams import EventSource, Harness, cleared, new_index, tokens

from router.index.redis import INDEX_PREFIX, SLOT_KEY, STATE_KEY, RedisIndex
from router.index.redis_codec import shard_of
from router.index.redis_read import FETCH, fetch_args
from router.ingest.block_keys import request_keys

BS = 16
FULL = {"group": 0, "kind": "full_attention"}
SWA = {"kind": "sliding_window", "window": 48}


async def test_a_removed_workers_slot_is_reused_without_its_rows(redis_url: str) -> None:
    h = Harness.build(new_index("redis", redis_url))
    client = redis.Redis.from_url(redis_url)
    src = EventSource()
    toks = tokens(8 * BS + 1)
    try:
        await h.feed("w0", src.store(toks, BS, 0, 8, **FULL))
        assert (await h.one(toks, "w0")).hit_tokens == 8 * BS
        slot = client.hget(SLOT_KEY, "w0")
        await h.index.remove_worker("w0")
        assert client.hget(SLOT_KEY, "w0") is None
        # Another worker takes the freed slot and holds only what it stores itself.
        await h.feed("w1", src.store(toks, BS, 0, 2, **FULL))
        assert client.hget(SLOT_KEY, "w1") == slot
        assert (await h.one(toks, "w1")).hit_tokens == 2 * BS
        # The rows hold w1's blocks only: none is left for the removed worker.
        rows = client.hvals(INDEX_PREFIX + "x:0")
        assert len(rows) == 2 and all(len(r) == 3 for r in rows)
    finally:
        await h.index.close()
        client.close()


async def test_a_replicas_cached_metadata_follows_another_replica(redis_url: str) -> None:
    """Replica ``a`` scores (and caches the workers' metadata and slots); replica ``b``
    removes a worker, creates one under another block size and adds one: ``a`` answers
    like ``b`` on its next score, not from its cache."""
    a = Harness.build(new_index("redis", redis_url))
    b = Harness.build(new_index("redis", redis_url))
    src = EventSource()
    toks = tokens(16 * BS + 1)
    workers = ["w0", "w1", "w2"]
    try:
        await b.feed("w0", src.store(toks, BS, 0, 8, **FULL))
        await b.feed("w1", src.store(toks, BS, 0, 4, **FULL))
        first = await a.score(toks, workers)
        assert [r.hit_tokens for r in sorted(first.workers, key=lambda r: r.worker_id)] == [
            8 * BS,
            4 * BS,
            0,
        ]
        await b.index.remove_worker("w0")
        await b.feed("w2", src.store(toks, BS, 0, 6, **FULL))  # may take w0's slot
        c = Harness.build(new_index("redis", redis_url))  # a third router re-creates w0
        await c.feed("w0", src.store(toks, 2 * BS, 0, 3, **FULL))  # at another size
        await c.index.close()
        for _ in range(2):  # the second score runs on the refreshed cache
            got = await a.score(toks, workers)
            assert got == await b.score(toks, workers)
            hits = {r.worker_id: r.hit_tokens for r in got.workers}
            assert hits == {"w0": 6 * BS, "w1": 4 * BS, "w2": 6 * BS}
    finally:
        await a.index.close()
        await b.index.close()


async def test_a_prefix_every_worker_holds_is_one_holders_string(redis_url: str) -> None:
    index = new_index("redis", redis_url)
    h = Harness.build(index)
    client = redis.Redis.from_url(redis_url)
    src = EventSource()
    toks = tokens(32 * BS + 1)
    workers = [f"w{i}" for i in range(40)]
    try:
        for w in workers:
            await h.feed(w, src.store(toks, BS, 0, 32, **FULL))
        assert {r.hit_tokens for r in (await h.score(toks, workers)).workers} == {32 * BS}
        keys = {BS: request_keys(toks, BS, None, None)}
        args = fetch_args([(INDEX_PREFIX, workers, None)], keys)
        got = client.eval(FETCH, 1, STATE_KEY, *args)
        assert int(got[3]) == 1  # one table
        g, bs, nread, rows = got[4:8]
        assert (int(g), int(bs), int(nread)) == (0, BS, 32)
        # The first block's 40 holders, then 31 one-byte "same as before" rows.
        assert len(rows) == 40 * 3 + 31 * 2
    finally:
        await index.close()
        client.close()


async def test_shards_answer_like_the_memory_index(redis_url: str) -> None:
    """Workers spread over several shards (what a cluster uses; here on one server): a
    score merges the shards' columns and answers exactly like the in-process index --
    40 workers take the all-workers path, 8 the per-worker one."""
    sharded = Harness.build(RedisIndex(redis_url, shards=5))
    ref = Harness.build(new_index("memory", None))
    rng = random.Random(5)
    src = EventSource()
    prompts = [tokens(12 * BS + 3, seed=j) for j in range(3)]
    workers = [f"w{i}" for i in range(40)]
    try:
        for w in workers:
            events = []
            for toks in prompts:
                if rng.random() < 0.4:
                    continue
                stop = rng.randint(1, 12)
                medium = rng.choice(["GPU", "GPU", "CPU"])
                events.append(src.store(toks, BS, 0, stop, **FULL))
                events.append(src.store(toks, BS, 0, stop, group=1, medium=medium, **SWA))
            for h in (sharded, ref):
                await h.feed(w, *events)
        assert len({shard_of(w, 5) for w in workers}) == 5
        hits = 0
        for toks in prompts:
            for ask in ([*workers, "nobody"], workers[:8]):
                got = await sharded.scorer.score_result(toks, ask)
                assert got == await ref.scorer.score_result(toks, ask)
                hits += sum(1 for r in got.workers if r.hit_tokens)
        assert hits > 40
    finally:
        await sharded.index.close()
        await ref.index.close()


async def test_a_worker_without_a_slot_holds_nothing(redis_url: str) -> None:
    """A worker with metadata but no write yet has no slot: it reads an all-zero column,
    never the blocks of a worker not asked about whose slot number that column has."""
    index = new_index("redis", redis_url)
    h = Harness.build(index)
    src = EventSource()
    toks = tokens(4 * BS + 1)
    try:
        await h.feed("w0", src.store(toks, BS, 0, 2, **FULL))  # slot 0
        await h.feed("w1", src.store(toks, BS, 0, 4, **FULL))  # slot 1
        state = await index.load_worker("w0")
        assert state is not None
        await index.save_worker("idle", state)  # metadata only
        for ask in (["w0", "idle"], [f"x{i}" for i in range(40)] + ["w0", "idle"]):
            got = {r.worker_id: r.hit_tokens for r in (await h.score(toks, ask)).workers}
            assert got["w0"] == 2 * BS and got["idle"] == 0
    finally:
        await index.close()


async def test_a_failing_call_mid_stream_leaves_the_connection_in_step(redis_url: str) -> None:
    """``apply_many`` streams its calls on one connection and reads the replies after the
    last: a script error in the middle is raised once every reply was read, the calls
    around it ran, and the next stream's replies are its own (not the old ones')."""
    from router.index.base import GPU_BIT, GroupMeta, StoreOp, WorkerState
    from router.index.redis_codec import worker_prefix

    index = new_index("redis", redis_url)
    client = redis.Redis.from_url(redis_url)
    groups = {0: GroupMeta("full_attention", BS)}
    try:
        for w in ("a", "b", "c"):
            await index.save_worker(w, WorkerState(dict(groups)))
        client.set(worker_prefix("b") + "keys", "not a set")  # b's APPLY fails: WRONGTYPE
        calls = [(w, groups, [StoreOp(0, GPU_BIT, [1, 2], [10 + i, 20 + i])]) for i, w in
                 enumerate("abc")]  # fmt: skip
        with pytest.raises(redis.exceptions.ResponseError):
            await index.apply_many(calls)
        assert await index.resolve("a", BS, [1, 2], live_only=True) == [10, 20]
        assert await index.resolve("c", BS, [1, 2], live_only=True) == [12, 22]
        assert await index.resolve("b", BS, [1, 2], live_only=True) == [None, None]
        client.delete(worker_prefix("b") + "keys")
        got = await index.apply_many([(w, groups, [StoreOp(0, GPU_BIT, [3], [30])]) for w in "abc"])
        assert [r.stored for r in got] == [1, 1, 1]
    finally:
        await index.close()
        client.close()


async def test_a_clear_and_a_removal_leave_no_key_of_the_worker(redis_url: str) -> None:
    """The worker's key set holds the (group, block size) pairs it stored into, and every
    data key name derives from them (``router.index.redis_lua``): a clear must still
    unlink the counts, copies, map and both ghost generations of each pair, and take the
    worker out of the shared rows; removing the worker leaves nothing of it."""
    from router.index.redis_codec import worker_prefix

    h = Harness.build(RedisIndex(redis_url, ghost_entries=4))
    client = redis.Redis.from_url(redis_url)
    src = EventSource()
    toks = tokens(12 * BS + 1)
    swa = {"group": 1, **SWA}
    try:
        for w in ("w0", "w1"):
            await h.feed(w, src.store(toks, BS, 0, 12, **FULL), src.store(toks, BS, 0, 12, **swa))
            await h.feed(w, src.store(toks, BS, 0, 3, **FULL))  # copies beyond the first
            await h.feed(w, src.store(toks, BS, 0, 12, medium="CPU", **FULL))
            for g in (0, 1):  # gone from every tier: 6 ghosts, 4 per generation
                await h.feed(w, src.remove(toks, BS, range(6, 12), group=g))
            await h.feed(w, src.remove(toks, BS, range(6, 12), group=0, medium="CPU"))
        p = worker_prefix("w0")
        names = {k.decode()[len(p) :] for k in client.scan_iter(match=p + "*")}
        assert {"e:16", "n:0", "n:1", "c:0", "t:16", "u:16", "keys"} <= names, names
        assert client.smembers(p + "keys") == {b"0 16", b"1 16"}
        stats = await h.index.stats()
        assert stats["entries"] == 2 * (6 + 6) and stats["map_entries"] == 2 * 6
        await h.feed("w0", cleared())
        left = {k.decode()[len(p) :] for k in client.scan_iter(match=p + "*")}
        assert left <= {"meta", "s"}, left
        assert (await h.one(toks, "w0")).hit_tokens == 0
        assert (await h.one(toks, "w1")).hit_tokens == 6 * BS
        await h.index.remove_worker("w1")
        assert not list(client.scan_iter(match=worker_prefix("w1") + "*"))
        for g in (0, 1):  # neither worker is in a shared row
            assert not client.hlen(INDEX_PREFIX + f"x:{g}")
    finally:
        await h.index.close()
        client.close()


async def test_an_engine_hash_twice_in_one_store_keeps_its_first_key(redis_url: str) -> None:
    """``APPLY`` maps a store's new engine hashes with one HSET and falls back only when
    its count shows a hash twice among them: the first key wins for the map and for the
    later occurrence (a copy of that block), as in the in-process index."""
    from router.index.base import CPU_BIT, GPU_BIT, GroupMeta, RemoveOp, StoreOp, WorkerState
    from router.index.memory import MemoryIndex

    groups = {0: GroupMeta("full_attention", BS), 1: GroupMeta("full_attention", BS)}
    batches = [
        [StoreOp(0, GPU_BIT, [1, 2, 1, 3], [10, 20, 11, 30]),
         StoreOp(1, GPU_BIT, [1, 2, 1, 3], [10, 20, 11, 30])],
        [StoreOp(0, CPU_BIT, [3, 4, 4], [31, 40, 41]), RemoveOp(0, GPU_BIT, [1, 2])],
        [RemoveOp(0, GPU_BIT, [1]), RemoveOp(1, GPU_BIT, [1, 1, 2, 4])],
    ]  # fmt: skip
    got = {}
    for index in (MemoryIndex(), RedisIndex(redis_url)):
        await index.save_worker("w", WorkerState(dict(groups)))
        results = [await index.apply("w", groups, ops) for ops in batches]
        live = await index.resolve("w", BS, [1, 2, 3, 4], live_only=True)
        got[index.kind] = (results, live, await index.group_counts("w"))
        await index.close()
    assert got["redis"] == got["memory"]
    assert got["redis"][1] == [None, None, 30, 40]


async def test_a_clear_takes_a_worker_written_before_the_pair_key_set_out(redis_url: str) -> None:
    """Before round 4b a worker's key set held its key names and ``gs`` its (group, block
    size) pairs: a clear of such a worker (nobody flushed) still leaves the shared rows
    and unlinks everything, instead of failing on a name that is not a pair."""
    from router.index.redis_codec import worker_prefix

    h = Harness.build(new_index("redis", redis_url))
    client = redis.Redis.from_url(redis_url)
    src = EventSource()
    toks = tokens(4 * BS + 1)
    p = worker_prefix("w0")
    try:
        await h.feed("w0", src.store(toks, BS, 0, 4, **FULL))
        client.rename(p + "keys", p + "gs")  # the old layout: pairs in gs, names in keys
        client.sadd(p + "keys", p + "n:0", p + "e:16")
        assert (await h.index.stats())["entries"] == 0  # names are skipped, not parsed
        await h.feed("w0", cleared())
        left = {k.decode()[len(p) :] for k in client.scan_iter(match=p + "*")}
        assert left <= {"meta", "s"}, left
        assert not client.hlen(INDEX_PREFIX + "x:0")
    finally:
        await h.index.close()
        client.close()
