"""A listen-mode worker after a router restart on a shared index (real redis-server, real
ZMQ; the engine connects to the router's bound SUB, as vLLM and llm-d deploy).

A worker with a socket of its own resumes from the seqs the index recorded before it
ingests anything. A worker the listener feeds did not: after a restart its first frame
read as a first contact (``partial_history``), and one that followed a gap was applied
over entries the missed batch had made stale (an evicted chain kept scoring).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import pytest
import zmq
import zmq.asyncio
from _helpers import batch, chain, hits, removed, store_chain, wait_until

from router.config import RouterSettings
from router.netutil import free_port
from router.service import RouterService
from schemas import KVEventBatch, encode_batch

TOPIC = b"kv@eng1"


class ConnectingEngine:
    """An XPUB that connects to the router's listen endpoint and sends each seq it is told
    once (a publisher never repeats one), after the router's SUB has subscribed."""

    def __init__(self, endpoint: str) -> None:
        self.ctx = zmq.asyncio.Context()
        self.pub = self.ctx.socket(zmq.XPUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.pub.setsockopt(zmq.XPUB_VERBOSE, 1)
        self.pub.connect(endpoint)

    async def subscribed(self) -> None:
        """Until a router's SUB (a new one after a restart) subscribes."""
        while (await self.pub.recv())[:1] != b"\x01":
            pass

    async def send(self, seq: int, b: KVEventBatch) -> None:
        await self.pub.send_multipart([TOPIC, seq.to_bytes(8, "big"), encode_batch(b)])

    def close(self) -> None:
        self.ctx.destroy(linger=0)


@pytest.fixture
def settings(redis_url: str) -> RouterSettings:
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    return RouterSettings(index="redis", redis_url=redis_url, listen=endpoint, index_check_s=0.2)


@pytest.fixture
async def engine(settings: RouterSettings) -> AsyncIterator[ConnectingEngine]:
    assert settings.listen is not None
    eng = ConnectingEngine(settings.listen)
    yield eng
    eng.close()


async def first_life(settings: RouterSettings, engine: ConnectingEngine) -> None:
    """A router ingests seqs 0 and 1 (chains 0 and 1), then stops."""
    svc = RouterService(settings)
    await svc.start()
    try:
        await engine.subscribed()
        await engine.send(0, batch(store_chain(0)))
        await engine.send(1, batch(store_chain(1)))

        async def both() -> bool:
            return "eng1" in svc.worker_ids() and [
                await hits(svc, "eng1", i) for i in range(2)
            ] == [8, 8]

        await wait_until(both, what="chains 0 and 1 indexed")
    finally:
        await svc.stop()


@contextlib.asynccontextmanager
async def second_life(
    settings: RouterSettings, engine: ConnectingEngine, sent: list[tuple[int, KVEventBatch]],
    chain_id: int, tokens: int,
) -> AsyncIterator[RouterService]:  # fmt: skip
    """A router restarted on the same index, once it has handled ``sent`` (seq, batch):
    chain ``chain_id`` then holds ``tokens`` on the listen worker."""
    svc = RouterService(settings)
    await svc.start()
    try:
        await engine.subscribed()
        for seq, b in sent:
            await engine.send(seq, b)

        async def applied() -> bool:
            return "eng1" in svc.worker_ids() and await hits(svc, "eng1", chain_id) == tokens

        await wait_until(applied, what=f"seqs {sent[0][0]}.. handled by the restarted router")
        yield svc
    finally:
        await svc.stop()


async def test_the_next_seq_after_a_restart_continues_the_stream(
    settings: RouterSettings, engine: ConnectingEngine
) -> None:
    await first_life(settings, engine)
    async with second_life(settings, engine, [(2, batch(removed(chain(0)[0])))], 0, 0) as svc:
        info = await svc.worker_info("eng1")
        assert info.partial_history is False and info.resyncs == 0
        assert await hits(svc, "eng1", 1) == 8  # the index's entries carried on


async def test_a_gap_across_the_restart_clears_what_it_made_stale(
    settings: RouterSettings, engine: ConnectingEngine
) -> None:
    await first_life(settings, engine)
    # Seq 2 (chain 1 evicted) went out while no router listened; seq 3 stores chain 2.
    async with second_life(settings, engine, [(3, batch(store_chain(2)))], 2, 8) as svc:
        info = await svc.worker_info("eng1")
        # No replay endpoint to fetch seq 2 from: the stale entries go, and the worker
        # says its history is partial (a lower bound) instead of scoring chain 1.
        assert info.partial_history is True
        assert await hits(svc, "eng1", 1) == 0


async def test_an_engine_that_restarted_while_no_router_listened_starts_over(
    settings: RouterSettings, engine: ConnectingEngine
) -> None:
    """The engine restarted too: its seqs begin again at 0, at or below what the index
    recorded. Resumed naively, those frames read as duplicates (dropped) and the old
    entries kept scoring. A listen worker has no replay to tell: a seq just below the
    recorded one could be a frame another router applied first, so the recorded seq
    decides -- here it arrives with another payload."""
    await first_life(settings, engine)
    sent = [(0, batch(store_chain(5))), (1, batch(store_chain(6)))]
    async with second_life(settings, engine, sent, 6, 8) as svc:
        # The old process's entries are gone; seq 0 of the new one came before the
        # evidence and is lost, which the worker says.
        assert [await hits(svc, "eng1", i) for i in (0, 1, 5)] == [0, 0, 0]
        info = await svc.worker_info("eng1")
        assert info.partial_history is True and info.resyncs == 1
