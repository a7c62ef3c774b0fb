"""The replay answers of SGLang's ``ZmqEventPublisher``, over real sockets.

The test engine's ROUTER answers a replay request as SGLang's ``_service_replay`` frames it:

* 0.5.22 and later: ``(ident, b"", topic, seq, payload)`` per buffered batch, then
  ``(ident, b"", b"", END_SEQ, b"")``: the form ``replay_client`` reads.
* 0.5.21 and earlier (checked in the 0.5.18-0.5.21 wheels): no topic frame,
  ``(ident, b"", seq, payload)``, then ``(ident, b"", END_SEQ, b"")``.

Both are read. The older form used to be skipped reply by reply as malformed, the end
marker never seen, and the request failed after its timeout: a worker on SGLang 0.5.21
never caught up at start-up and never filled a gap.
"""

from __future__ import annotations

import pytest
import zmq.asyncio
from _helpers import FakeEngine, batch, hits, start_subscribed, store_chain, wait_until

from router.ingest.replay_client import request_replay
from schemas import AllBlocksCleared, KVEventBatch, encode_batch

PAYLOADS = [encode_batch(KVEventBatch(float(i), [AllBlocksCleared()], 0)) for i in range(3)]


@pytest.mark.parametrize("replay_topic", [True, False], ids=["0.5.22+", "0.5.21-"])
async def test_both_sglang_replay_answers_are_read(replay_topic: bool) -> None:
    """``FakeEngine(replay_topic=False)`` answers as SGLang up to 0.5.21: no topic frame,
    then ``[b"", END_SEQ, b""]``."""
    engine = FakeEngine(topic="kv", replay_topic=replay_topic)
    ctx = zmq.asyncio.Context()
    try:
        for payload in PAYLOADS:
            await engine.publish_payload(payload, deliver=False)
        assert engine.replay_endpoint is not None
        frames, malformed = await request_replay(ctx, engine.replay_endpoint, 1, timeout_s=1.0)
    finally:
        ctx.destroy(linger=0)
        await engine.close()
    topic = b"kv" if replay_topic else None
    assert malformed == 0
    assert [(f.seq, f.topic, f.payload) for f in frames] == [
        (1, topic, PAYLOADS[1]),
        (2, topic, PAYLOADS[2]),
    ]


async def test_a_topic_subscription_fills_a_gap_from_an_answer_without_topics() -> None:
    """Through the router: a worker subscribed to topic "kv" on a publisher whose replay
    answers carry no topic frame. A batch missed live is replayed and applied (the topic
    filter keeps answers without topics: they come from this worker's publisher)."""
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
