"""Ingest that never lies: a failed index write is repaired, never recorded as applied.

The failure is real, not mocked: another client wrote a string where the Redis index
keeps the worker's key set, so the APPLY script fails with WRONGTYPE (not an outage).
"""

from __future__ import annotations

import logging

import pytest
import redis
from _helpers import FakeEngine, batch, hits, store_chain, subscribe, wait_until

from router.config import RouterSettings
from router.index.redis import worker_prefix
from router.service import RouterService


async def test_a_failed_write_is_not_applied_and_the_worker_is_rebuilt(
    redis_url: str, engine: FakeEngine, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="router.ingest.writer")
    svc = RouterService(RouterSettings(index="redis", redis_url=redis_url, replay_timeout_s=2))
    await svc.start()
    try:
        sub = await subscribe(svc, engine)
        await engine.publish(batch(store_chain(0)))
        await wait_until(lambda: sub.last_seq.get(0) == 0, what="seq 0 applied")
        assert await hits(svc, "w0", 0) == 8

        client = redis.Redis.from_url(redis_url)
        client.delete(worker_prefix("w0") + "keys")
        client.set(worker_prefix("w0") + "keys", "not a set")  # WRONGTYPE for SADD
        await engine.publish(batch(store_chain(1)))
        await wait_until(lambda: sub.counters.ingest_errors >= 1, what="the failed write")
        await wait_until(lambda: sub.faulted, what="the worker marked faulted")
        # Repeated failures stay visible (not "logged once per process"), with a count.
        await wait_until(lambda: sub.counters.ingest_errors >= 2, what="a failed repair")
        failed = [r.getMessage() for r in caplog.records if "so far); the worker" in r.getMessage()]
        assert len(failed) >= 2 and "(2 so far)" in failed[1], failed
        assert (await svc.worker_info("w0")).faulted
        # Repairs fail while the key stays wrong (with backoff), chain 1 is not indexed.
        assert await hits(svc, "w0", 1) == 0
        client.delete(worker_prefix("w0") + "keys")
        await engine.publish(batch(store_chain(2)))

        async def rebuilt() -> bool:
            return [await hits(svc, "w0", i) for i in range(3)] == [8, 8, 8]

        await wait_until(rebuilt, what="every chain indexed after the repair")
        await wait_until(lambda: not sub.faulted, what="the fault cleared")
        assert sub.counters.resyncs >= 1
    finally:
        await svc.stop()
