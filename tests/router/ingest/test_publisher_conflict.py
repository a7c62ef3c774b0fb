"""Two publishers under one topic: a conflict, not a resync storm.

Two vLLM servers in one pod share the pod IP, so with ``--listen`` (``kv@<pod-ip>@...``)
or a bound worker endpoint both engines land on one worker. Their seqs interleave; every
rewind used to read as a publisher restart that cleared the worker and rebuilt it from
the other engine's frames, so its index mixed two caches and it never said why. Real ZMQ
on loopback: two engines connect to one worker's bound SUB under one topic.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import zmq
import zmq.asyncio
from _helpers import batch, hits, store_chain, wait_until

from router.config import RouterSettings, WorkerSpec
from router.ingest.conflicts import PublisherConflict
from router.netutil import free_port
from router.service import RouterService
from schemas import KVEventBatch, encode_batch

TOPIC = b"kv@pod"


def test_three_rewinds_within_the_window_are_a_conflict_until_they_stop() -> None:
    c = PublisherConflict(restarts=3, window_s=10.0)
    assert not c.rewound(0.0) and not c.rewound(4.0)
    assert not c.rewound(20.0)  # three rewinds, but over 20 s: restarts, not a conflict
    assert not c.rewound(21.0)
    assert c.rewound(22.0) and c.active(22.0) and c.episodes == 1
    assert not c.rewound(25.0)  # the same conflict goes on
    assert c.active(35.0) and not c.ended(35.0)
    assert not c.active(35.1) and c.ended(35.1) and not c.ended(36.0)


class Engine:
    """One engine's XPUB, connected to the worker's bound SUB, counting its own seqs."""

    def __init__(self, ctx: zmq.asyncio.Context, endpoint: str) -> None:
        self.pub = ctx.socket(zmq.XPUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.pub.connect(endpoint)
        self.seq = 0

    async def subscribed(self) -> None:
        while (await self.pub.recv())[:1] != b"\x01":
            pass

    async def send(self, b: KVEventBatch) -> None:
        await self.pub.send_multipart([TOPIC, self.seq.to_bytes(8, "big"), encode_batch(b)])
        self.seq += 1


@pytest.fixture
async def ctx() -> AsyncIterator[zmq.asyncio.Context]:
    context = zmq.asyncio.Context()
    yield context
    context.destroy(linger=0)


async def test_interleaved_publishers_are_a_visible_conflict_and_the_worker_recovers(
    ctx: zmq.asyncio.Context,
) -> None:
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    svc = RouterService(RouterSettings())
    await svc.start()
    try:
        await svc.add_worker(
            WorkerSpec(worker_id="pod", endpoint=endpoint, bind=True, topic=TOPIC.decode())
        )
        sub = svc.subscriptions.get("pod")
        assert sub is not None
        sub._conflict = PublisherConflict(window_s=1.0)  # the test's patience, not 10 s
        a, b = Engine(ctx, endpoint), Engine(ctx, endpoint)
        await a.subscribed()
        await b.subscribed()
        await a.send(batch(store_chain(0)))

        async def first() -> bool:
            return await hits(svc, "pod", 0) == 8

        await wait_until(first, what="engine a's first batch")

        async def handled(engine: Engine, chain: int) -> None:
            """Send, and wait until the router has sequenced it: frames from two
            connections reach the SUB in no fixed order otherwise."""
            await engine.send(batch(store_chain(chain)))
            seq = engine.seq - 1
            await wait_until(lambda: sub._seq.live.get(0) == seq, what=f"seq {seq} handled")

        for i in range(3):  # b starts at seq 0 and each counts on: the seqs interleave
            await handled(b, 10 + i)
            await handled(a, 1 + i)

        async def conflict() -> bool:
            return (await svc.worker_info("pod")).state == "conflict"

        await wait_until(conflict, what="the worker in conflict")
        # Cleared once, and nothing of either engine applied while it lasts.
        assert [await hits(svc, "pod", i) for i in (0, 1, 2, 3, 10, 11, 12)] == [0] * 7
        text = (await svc.metrics.render()).decode()
        assert 'kvroute_worker_state{state="conflict",worker="pod"} 1.0' in text
        # Two rewinds read as restarts, then one clear for the conflict; and while it
        # lasts, a rewind is not a restart any more (before: one resync per rewind).
        assert sub.counters.resyncs == 3
        for i in range(3):
            await handled(b, 13 + i)
            await handled(a, 4 + i)
        assert sub.counters.resyncs == 3 and (await svc.worker_info("pod")).state == "conflict"

        # Engine b goes away; after a quiet window the worker is rebuilt from a's stream.
        async def rebuilt() -> bool:
            await a.send(batch(store_chain(100 + a.seq)))  # a keeps publishing meanwhile
            info = await svc.worker_info("pod")
            return info.state == "connected" and await hits(svc, "pod", 100 + a.seq - 2) == 8

        await wait_until(rebuilt, what="the worker rebuilt once the rewinds stopped")
    finally:
        await svc.stop()
