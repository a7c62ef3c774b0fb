"""A shared index that loses its content, and a router that restarts on one.

Real redis-server, real ZMQ: the Redis database is flushed under a running router (what a
restart without persistence leaves), and a second router starts on the same Redis.
"""

from __future__ import annotations

import asyncio

import redis
from _helpers import FakeEngine, batch, chain, hits, removed, store_chain, wait_until

from router.config import RouterSettings, WorkerSpec
from router.service import RouterService


def settings(url: str) -> RouterSettings:
    return RouterSettings(index="redis", redis_url=url, replay_timeout_s=2, index_check_s=0.2)


async def test_lost_index_is_noticed_and_rebuilt(redis_url: str, engine: FakeEngine) -> None:
    svc = RouterService(settings(redis_url))
    await svc.start()
    try:
        await svc.add_worker(WorkerSpec(**engine.spec("w0")))
        await engine.wait_subscribed()
        for i in range(2):
            await engine.publish(batch(store_chain(i)))

        async def both() -> bool:
            return [await hits(svc, "w0", i) for i in range(2)] == [8, 8]

        await wait_until(both, what="both chains indexed")
        redis.Redis.from_url(redis_url).flushall()  # the content is gone
        await wait_until(both, what="both chains rebuilt from the publisher's buffer")
        assert svc.index_watch is not None and svc.index_watch.losses == 1
        info = await svc.worker_info("w0")
        assert info.resyncs >= 1 and info.partial_history is False
    finally:
        await svc.stop()


async def test_rest_registrations_survive_a_router_restart(
    redis_url: str, engine: FakeEngine
) -> None:
    first = RouterService(settings(redis_url))
    await first.start()
    try:
        await first.add_worker(WorkerSpec(**engine.spec("w0", hash_block_size=4)))
        await engine.wait_subscribed()
        await engine.publish(batch(store_chain(0)))
        await wait_until(lambda: first.subscriptions.get("w0").last_seq.get(0) == 0)  # type: ignore[union-attr]
    finally:
        await first.stop()
    second = RouterService(settings(redis_url))  # no --worker: only what Redis kept
    await second.start()
    try:
        assert second.worker_ids() == ["w0"]
        assert second.worker_spec("w0").hash_block_size == 4
        await engine.publish(batch(store_chain(1)))

        async def resumed() -> bool:
            return [await hits(second, "w0", i) for i in range(2)] == [8, 8]

        await wait_until(resumed, what="the restarted router resumes from the index")
        sub = second.subscriptions.get("w0")
        assert sub is not None and sub.counters.resyncs == 0  # resumed, not rebuilt
        await second.remove_worker("w0")
    finally:
        await second.stop()
    third = RouterService(settings(redis_url))
    await third.start()
    try:
        assert third.worker_ids() == []  # a deleted registration stays deleted
    finally:
        await third.stop()


async def test_the_watch_and_metrics_outlive_a_wrong_typed_key(
    redis_url: str, engine: FakeEngine
) -> None:
    """A wrong-typed key is not an outage: the watch's check failed with Redis's
    WRONGTYPE, which ended its task for good (a later flush went unnoticed), and every
    /metrics scrape answered 500."""
    from router.index.redis import WORKERS_KEY

    svc = RouterService(settings(redis_url))
    await svc.start()
    db = redis.Redis.from_url(redis_url)
    try:
        await svc.add_worker(WorkerSpec(**engine.spec("w0")))
        await engine.wait_subscribed()
        await engine.publish(batch(store_chain(0)))

        async def indexed() -> bool:
            return await hits(svc, "w0", 0) == 8

        await wait_until(indexed, what="chain indexed")
        kept = db.smembers(WORKERS_KEY)
        db.delete(WORKERS_KEY)
        db.set(WORKERS_KEY, "not a set")
        watch = svc.index_watch
        assert watch is not None
        await wait_until(lambda: watch.errors >= 2, what="checks failing, the watch alive")
        scraped = await svc.metrics.render()  # an exception before: every scrape a 500
        assert b"kvroute_index_watch_errors_total" in scraped
        db.delete(WORKERS_KEY)
        db.sadd(WORKERS_KEY, *kept)
        db.flushall()  # and now a real loss: still noticed
        await wait_until(lambda: watch.losses == 1, what="the loss noticed")
        await wait_until(indexed, what="chain rebuilt")
    finally:
        db.close()
        await svc.stop()


async def test_a_worker_removed_on_one_replica_stays_removed_on_the_other(
    redis_url: str, engine: FakeEngine
) -> None:
    """DELETE on one replica: the other's watch took the missing worker for lost content,
    registered it again (undoing the delete) and resynced every worker."""
    other = FakeEngine()
    configured = WorkerSpec(**other.spec("w0"))
    a = RouterService(settings(redis_url).model_copy(update={"workers": [configured]}))
    await a.start()
    b: RouterService | None = None
    try:
        await a.add_worker(WorkerSpec(**engine.spec("w3")))  # over REST, kept in Redis
        b = RouterService(settings(redis_url).model_copy(update={"workers": [configured]}))
        await b.start()  # restores w3 from Redis
        assert sorted(b.worker_ids()) == ["w0", "w3"]
        await a.remove_worker("w3")
        await wait_until(lambda: b is not None and b.worker_ids() == ["w0"], what="w3 gone on b")
        assert b.index_watch is not None and b.index_watch.losses == 0
        assert await b.index.load_registrations() == {}
        assert sorted(await b.index.known_workers()) == ["w0"]
    finally:
        if b is not None:
            await b.stop()
        await a.stop()
        await other.close()


async def test_a_rebuild_another_router_left_midway_is_redone_here(
    redis_url: str, engine: FakeEngine
) -> None:
    """Another router cleared the worker (to rebuild it) and stopped before writing
    anything: this router's live batches follow a seq the index no longer holds, so the
    index defers them (``SeqOp.follows``) and nobody moves it on. After
    ``index_defer_max_s`` of that, this router rebuilds the worker itself."""
    from router.index import make_index

    svc = RouterService(settings(redis_url).model_copy(update={"index_defer_max_s": 0.3}))
    await svc.start()
    other = make_index("redis", redis_url)
    try:
        await svc.add_worker(WorkerSpec(**engine.spec("w0")))
        await engine.wait_subscribed()
        await engine.publish(batch(store_chain(0)))
        await wait_until(lambda: hits(svc, "w0", 0), what="chain 0 indexed")
        await other.clear_worker("w0")  # the other router's clear; then it is gone
        await engine.publish(batch(store_chain(1)))

        async def both() -> bool:
            return [await hits(svc, "w0", i) for i in range(2)] == [8, 8]

        await wait_until(both, what="both chains rebuilt by this router")
        assert svc.ingestor.counters.batches_deferred >= 1
        assert (await svc.worker_info("w0")).resyncs == 1
    finally:
        await other.close()
        await svc.stop()


async def test_two_routers_keep_one_exact_index_while_each_rebuilds(
    redis_url: str, engine: FakeEngine
) -> None:
    """Two routers ingest one engine into one Redis; each in turn clears and rebuilds the
    worker while the engine keeps publishing (every batch stores a chain and removes the
    one three batches back, but every fifth chain stays) and the other keeps writing
    meanwhile (the replay's answer waits for it). The index ends exactly as the stream
    says, one copy per block, on both, and no router rebuilds but when asked. Before the
    deferral rule, the live batches recorded first made the rebuild's look applied and
    the chains stored before them went missing."""
    routers = [RouterService(settings(redis_url)) for _ in range(2)]
    for svc in routers:
        await svc.start()
    try:
        subs = []
        for svc in routers:
            await svc.add_worker(WorkerSpec(**engine.spec("w0")))
            subs.append(svc.subscriptions.get("w0"))
        await engine.wait_subscribed(2)
        await wait_until(  # both catch-up replays answered: none waits behind the gate
            lambda: len(engine.replay_requests) == 2 and not any(s.syncing for s in subs),
            what="both caught up",
        )

        async def publish(i: int) -> None:
            gone = [removed(chain(i - 3)[0])] if i >= 3 and (i - 3) % 5 else []
            await engine.publish(batch(store_chain(i), *gone))

        for i in range(20):
            await publish(i)
        await wait_until(lambda: all(s.last_seq.get(0) == 19 for s in subs), what="seq 19")
        for turn, (sub, other) in enumerate([subs, subs[::-1]]):
            # This one clears and asks for the buffer; the answer waits until the other
            # has written twenty live batches.
            engine.replay_gate = asyncio.Event()
            asked = len(engine.replay_requests)
            sub.request_resync("a test")
            await wait_until(lambda n=asked: len(engine.replay_requests) > n, what="replay asked")
            top = 20 * (turn + 2) - 1
            for i in range(top - 19, top + 1):
                await publish(i)
            await wait_until(lambda o=other, t=top: o.last_seq.get(0) == t, what="the other at top")
            engine.replay_gate.set()
            await wait_until(
                lambda t=top: all(s.last_seq.get(0) == t and not s.syncing for s in subs),
                what="both routers at the top",
            )
        engine.replay_gate = None
        held = [i for i in range(60) if i % 5 == 0 or i >= 57]
        for svc in routers:
            assert [i for i in range(60) if await hits(svc, "w0", i)] == held
            keys = await svc.index.resolve("w0", 4, [h for i in held for h in chain(i)[0]])
            assert await svc.index.copies("w0", 0, keys) == [1] * 2 * len(held)
        assert [s.counters.resyncs for s in subs] == [1, 1]
    finally:
        for svc in routers:
            await svc.stop()


async def first_life_without_replay(redis_url: str, engine: FakeEngine, frames: int) -> None:
    """A router applies ``frames`` seqs (chain i at seq i) of an engine without a replay
    endpoint, then stops."""
    first = RouterService(settings(redis_url))
    await first.start()
    try:
        await first.add_worker(WorkerSpec(**engine.spec("w0")))
        await engine.wait_subscribed()
        for i in range(frames):
            await engine.publish(batch(store_chain(i)))
        sub = first.subscriptions.get("w0")
        assert sub is not None
        await wait_until(lambda: sub.last_seq.get(0) == frames - 1, what="all applied")
    finally:
        await first.stop()


async def test_an_engine_without_replay_that_restarted_while_the_router_was_down(
    redis_url: str,
) -> None:
    """No replay endpoint, so no catch-up replay to notice it: the engine's seqs begin
    again at 0, far below what the index recorded. They used to read as duplicates
    (dropped) while the old process's entries kept scoring."""
    from router.ingest.live_verdicts import RESUME_LEAD

    engine = FakeEngine(replay=False)
    try:
        await first_life_without_replay(redis_url, engine, RESUME_LEAD + 2)
        engine.restart_seq()
        second = RouterService(settings(redis_url))
        await second.start()
        try:
            await engine.wait_subscribed(2)
            await engine.publish(batch(store_chain(1000)))  # seq 0 of the new process

            async def started_over() -> bool:
                return [await hits(second, "w0", i) for i in (0, 1, 1000)] == [0, 0, 8]

            await wait_until(started_over, what="the old process's entries gone, seq 0 in")
        finally:
            await second.stop()
    finally:
        await engine.close()


async def test_a_frame_another_router_applied_first_is_not_a_restart(redis_url: str) -> None:
    """Routers sharing the index: the last recorded batch may reach this one's fresh SUB
    after another router applied it. Same seq, same payload: a duplicate, nothing
    cleared."""
    engine = FakeEngine(replay=False)
    try:
        await first_life_without_replay(redis_url, engine, 2)
        second = RouterService(settings(redis_url))
        await second.start()
        try:
            await engine.wait_subscribed(2)
            last = engine.buffer[-1]
            await engine.send_raw([engine.topic, last[0].to_bytes(8, "big"), last[1]])
            await engine.publish(batch(store_chain(2)))

            async def carried_on() -> bool:
                return [await hits(second, "w0", i) for i in range(3)] == [8, 8, 8]

            await wait_until(carried_on, what="seq 2 applied over the kept entries")
            info = await second.worker_info("w0")
            assert info.resyncs == 0 and info.duplicates == 1
        finally:
            await second.stop()
    finally:
        await engine.close()
