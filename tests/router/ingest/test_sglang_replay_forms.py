"""The replay answers of SGLang's ``ZmqEventPublisher``, over real sockets.

A ROUTER answers a replay request exactly as SGLang's ``_service_replay`` frames it:

* 0.5.22 and later: ``(ident, b"", topic, seq, payload)`` per buffered batch, then
  ``(ident, b"", b"", END_SEQ, b"")``: the form ``replay_client`` reads.
* 0.5.21 and earlier (checked in the 0.5.18-0.5.21 wheels): no topic frame,
  ``(ident, b"", seq, payload)``, then ``(ident, b"", END_SEQ, b"")``.

Both are read. The older form used to be skipped reply by reply as malformed, the end
marker never seen, and the request failed after its timeout: a worker on SGLang 0.5.21
never caught up at start-up and never filled a gap.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import zmq
import zmq.asyncio

from router.ingest.replay_client import request_replay
from schemas import REPLAY_END_SEQ, AllBlocksCleared, KVEventBatch, encode_batch

PAYLOADS = [encode_batch(KVEventBatch(float(i), [AllBlocksCleared()], 0)) for i in range(3)]


@contextlib.asynccontextmanager
async def sglang_replay_router(*, with_topic: bool, topic: bytes = b"") -> AsyncIterator[str]:
    """A ROUTER holding ``PAYLOADS`` as seqs 0..2, answering as SGLang's publisher does."""
    ctx = zmq.asyncio.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.bind("tcp://127.0.0.1:*")

    async def serve() -> None:
        while True:
            ident, _, start_bytes = await sock.recv_multipart()
            start = int.from_bytes(start_bytes, "big")
            for seq, payload in enumerate(PAYLOADS):
                if seq < start:
                    continue
                head = [topic] if with_topic else []
                await sock.send_multipart([ident, b"", *head, seq.to_bytes(8, "big"), payload])
            end = [b""] if with_topic else []
            await sock.send_multipart([ident, b"", *end, REPLAY_END_SEQ, b""])

    task = asyncio.create_task(serve())
    try:
        yield sock.getsockopt_string(zmq.LAST_ENDPOINT)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        ctx.destroy(linger=0)


async def _ask(endpoint: str, start: int) -> tuple[list[tuple[int, bytes, bytes]], int]:
    ctx = zmq.asyncio.Context()
    try:
        frames, malformed = await request_replay(ctx, endpoint, start, timeout_s=1.0)
        return [(f.seq, f.topic, f.payload) for f in frames], malformed
    finally:
        ctx.destroy(linger=0)


async def test_sglang_0_5_22_replay_answer_is_read() -> None:
    async with sglang_replay_router(with_topic=True, topic=b"kv") as endpoint:
        frames, malformed = await _ask(endpoint, 1)
    assert malformed == 0
    assert frames == [(1, b"kv", PAYLOADS[1]), (2, b"kv", PAYLOADS[2])]


async def test_sglang_0_5_21_replay_answer_is_read() -> None:
    async with sglang_replay_router(with_topic=False) as endpoint:
        frames, malformed = await _ask(endpoint, 1)
    assert malformed == 0
    assert [(seq, payload) for seq, _, payload in frames] == [(1, PAYLOADS[1]), (2, PAYLOADS[2])]


async def test_a_topic_subscription_fills_a_gap_from_an_answer_without_topics() -> None:
    """Through the router: a worker subscribed to topic "kv" on a publisher whose replay
    answers carry no topic frame. A batch missed live is replayed and applied (the topic
    filter keeps answers without topics: they come from this worker's publisher)."""
    from _helpers import FakeEngine, batch, hits, start_subscribed, store_chain, wait_until

    engine = FakeEngine(topic="kv", replay_topic=False)
    svc, sub = await start_subscribed(engine)
    try:
        await engine.publish(batch(store_chain(0)), deliver=False)  # lost on the way
        await engine.publish(batch(store_chain(1)))
        await wait_until(lambda: sub.last_seq.get(0) == 1, what="the gap filled")

        async def both() -> bool:
            return [await hits(svc, "w0", i) for i in range(2)] == [8, 8]

        await wait_until(both, what="both chains indexed")
        assert sub.counters.replay_failures == 0 and sub.partial_history is False
    finally:
        await svc.stop()
        await engine.close()
