"""A replay answer is checked before any of it is applied, and the ends of the seq range
are handled: the seq a replayed frame carries becomes the worker's last applied seq, so
one frame far ahead of the stream would turn every later live batch into a "duplicate"
(ingestion frozen while the worker shows ``connected``).

Real sockets throughout: a ``FakeEngine`` whose replay buffer the test salts with a lie,
or a scripted ROUTER speaking the replay protocol (docs/design.md#wire-format).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import zmq
import zmq.asyncio
from _helpers import FakeEngine, batch, hits, start_subscribed, store_chain, wait_until

from router.ingest.replay_client import MAX_SEQ, ReplayTooLarge, request_replay
from schemas import REPLAY_END_SEQ, encode_batch

LIE = 2**62  # a seq the live stream never showed


def be(seq: int) -> bytes:
    return seq.to_bytes(8, "big")


@contextlib.asynccontextmanager
async def scripted_replay(
    answer: Callable[[int], list[list[bytes]]],
) -> AsyncIterator[str]:
    """A replay ROUTER answering ``answer(start)`` (replies after ``[ident, b""]``) and
    then the end marker; yields its endpoint."""
    ctx = zmq.asyncio.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.bind("tcp://127.0.0.1:*")

    async def serve() -> None:
        while True:
            ident, _, start = await sock.recv_multipart()
            for reply in answer(int.from_bytes(start, "big")):
                await sock.send_multipart([ident, b"", *reply])
            await sock.send_multipart([ident, b"", b"", REPLAY_END_SEQ, b""])

    task = asyncio.create_task(serve())
    try:
        yield sock.getsockopt_string(zmq.LAST_ENDPOINT)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        ctx.destroy(linger=0)


async def ask(endpoint: str, start: int, **kw: Any) -> tuple[list[int], int]:
    ctx = zmq.asyncio.Context()
    try:
        frames, malformed = await request_replay(ctx, endpoint, start, timeout_s=5, **kw)
        return [f.seq for f in frames], malformed
    finally:
        ctx.destroy(linger=0)


async def test_replies_below_the_start_out_of_order_or_jumping_ahead_are_skipped() -> None:
    def answer(start: int) -> list[list[bytes]]:
        seqs = [start - 1, start, start + 2, start + 1, start + 1, LIE, start + 2, start + 3]
        return [[b"kv", be(s), b"payload"] for s in seqs]

    async with scripted_replay(answer) as endpoint:
        # below the start, a jump (+2 after start), a repeat and the lie: 4 skipped
        assert await ask(endpoint, 10) == ([10, 11, 12, 13], 4)
        # ``upto``: nothing past it is kept; the first frame past it ends the answer
        assert await ask(endpoint, 10, upto=12) == ([10, 11, 12], 4)
        assert await ask(endpoint, 10, upto=9) == ([], 1)


async def test_skipped_replies_count_against_the_answers_bounds() -> None:
    """A peer answering nothing but replies to skip cannot keep the caller reading."""

    def answer(start: int) -> list[list[bytes]]:
        return [[b"kv", be(start - 1), b"payload"] for _ in range(50)]

    async with scripted_replay(answer) as endpoint:
        with pytest.raises(ReplayTooLarge, match="10 frames"):
            await ask(endpoint, 10, max_frames=10)
        assert await ask(endpoint, 10, max_frames=50) == ([], 50)


async def test_the_end_marker_is_recognised_only_with_its_exact_shape(engine: FakeEngine):
    """A batch at seq 2**64-1 (all-FF, the end marker's seq) with an empty topic is a
    batch, not the end of the answer."""
    engine.next_seq = MAX_SEQ
    await engine.publish(batch(store_chain(0)), deliver=False)
    assert engine.replay_endpoint is not None
    assert await ask(engine.replay_endpoint, MAX_SEQ) == ([MAX_SEQ], 0)
    with pytest.raises(Exception, match="out of range"):  # no OverflowError: a ReplayFailed
        await ask(engine.replay_endpoint, MAX_SEQ + 1)


async def test_a_lying_frame_in_a_gap_replay_is_dropped_and_ingestion_goes_on(
    engine: FakeEngine,
):
    """The audit's case: the answer to a gap replay holds the real frames plus one at
    seq 2**62. Before the fix it became the last seq and every later batch was dropped."""
    svc, sub = await start_subscribed(engine)
    try:
        await engine.publish(batch(store_chain(0)))
        await wait_until(lambda: sub.last_seq.get(0) == 0, what="seq 0 applied")
        await engine.publish(batch(store_chain(1)), deliver=False)  # lost on the wire
        seq2 = await engine.publish(batch(store_chain(2)), deliver=False)
        engine.buffer.append((LIE, encode_batch(batch())))  # answered after seq 2
        payload2 = dict(engine.buffer)[seq2]
        await engine.send_raw([engine.topic, be(seq2), payload2])  # seq 2 live: a gap
        await wait_until(lambda: sub.counters.gaps == 1 and not sub.syncing, what="gap replay")
        last = await engine.publish(batch(store_chain(3)))
        await wait_until(lambda: sub.last_seq.get(0) == last, what="the next batch applied")
        assert [await hits(svc, "w0", i) for i in range(4)] == [8, 8, 8, 8]
        assert sub.counters.decode_errors == 1  # the lie, counted
        assert sub.counters.resyncs == 0 and sub.state == "connected"
        metrics = await svc.metrics.render()
        assert b'kvroute_decode_errors_total{worker="w0"} 1.0' in metrics
    finally:
        await svc.stop()


async def test_a_lying_frame_in_a_tail_check_answer_is_dropped(engine: FakeEngine):
    """A tail check asks for what follows the last seq with no live seq to bound it: the
    answer's seqs must follow one another."""
    svc, sub = await start_subscribed(engine, tail_check_s=0.3)
    try:
        await engine.publish(batch(store_chain(0)))
        await wait_until(lambda: sub.last_seq.get(0) == 0, what="seq 0 applied")
        lost = await engine.publish(batch(store_chain(1)), deliver=False)  # the tail
        engine.buffer.append((LIE, encode_batch(batch())))
        await wait_until(lambda: sub.counters.decode_errors == 1, what="the lie skipped")
        assert sub.last_seq.get(0) == lost
        # Later checks start after ``lost``: the lie comes first, and is not applied.
        checks = sub.counters.tail_checks
        await wait_until(lambda: sub.counters.tail_checks >= checks + 2, what="tail checks")
        assert sub.last_seq.get(0) == lost
        last = await engine.publish(batch(store_chain(2)))
        await wait_until(lambda: sub.last_seq.get(0) == last, what="the next batch applied")
        assert [await hits(svc, "w0", i) for i in range(3)] == [8, 8, 8]
    finally:
        await svc.stop()


async def test_a_batch_at_the_last_seq_does_not_crash_the_tail_check(engine: FakeEngine):
    """Nothing follows seq 2**64-1: the tail check asks nothing (it used to ask for
    2**64, an OverflowError that killed the task and made a spurious resync)."""
    svc, sub = await start_subscribed(engine, tail_check_s=0.2)
    try:
        engine.next_seq = MAX_SEQ - 1  # an engine far into its stream (joined there)
        await engine.publish(batch(store_chain(0)))
        await engine.publish(batch(store_chain(1)))
        await wait_until(lambda: sub.last_seq.get(0) == MAX_SEQ, what="the last seq applied")
        checks = sub.counters.tail_checks
        await wait_until(lambda: sub.counters.tail_checks >= checks + 2, what="tail checks")
        assert sub.counters.task_restarts == 0 and sub.counters.resyncs == 0
        assert sub.counters.replay_failures == 0  # nothing asked: nothing can follow
        assert sub.last_seq[0] == MAX_SEQ
        assert [await hits(svc, "w0", i) for i in range(2)] == [8, 8]
    finally:
        await svc.stop()
