"""Replay over a real DEALER on loopback: middle, before the buffer, beyond the end."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import zmq
from _zmq_client import (
    END_MARKER,
    golden_frames,
    inproc_name,
    recv_frames,
    recv_through,
    replay,
    seq_of,
    settle,
    subscribe,
    wait_until,
)

from publisher import ZmqEventPublisher
from schemas import (
    REPLAY_END_SEQ,
    AllBlocksCleared,
    BlockRemoved,
    KVEventBatch,
    decode_batch,
    encode_batch,
)

TOPIC = "kv@w-replay"


def batch(i: int) -> KVEventBatch:
    return KVEventBatch(ts=1000.0 + i, events=[BlockRemoved(block_hashes=[i], medium="GPU")])


@pytest.fixture
def pub10(make_pub: Callable[..., ZmqEventPublisher]) -> ZmqEventPublisher:
    """Ten batches published (seq 0..9) into a buffer of four: seq 6..9 remain."""
    pub = make_pub(
        "tcp://127.0.0.1:*", replay_endpoint="tcp://127.0.0.1:*", topic=TOPIC, buffer_steps=4
    )
    for i in range(10):
        pub.publish(batch(i))
    wait_until(lambda: pub.published == 10)
    return pub


def expect(seqs: range) -> list[list[bytes]]:
    frames = []
    for s in seqs:
        b = batch(s)
        b.data_parallel_rank = 0
        frames.append([b"", TOPIC.encode(), s.to_bytes(8, "big"), encode_batch(b)])
    return [*frames, END_MARKER]


def test_end_marker_bytes() -> None:
    assert REPLAY_END_SEQ == b"\xff" * 8
    assert golden_frames("replay")[-1] == END_MARKER


def test_replay_from_the_middle_of_the_buffer(ctx: zmq.Context, pub10: ZmqEventPublisher) -> None:
    assert pub10.bound_replay_endpoint is not None
    assert replay(ctx, pub10.bound_replay_endpoint, 7) == expect(range(7, 10))
    assert replay(ctx, pub10.bound_replay_endpoint, 6) == expect(range(6, 10))
    assert replay(ctx, pub10.bound_replay_endpoint, 9) == expect(range(9, 10))


def test_replay_from_before_the_buffer_starts_at_the_oldest_kept(
    ctx: zmq.Context, pub10: ZmqEventPublisher
) -> None:
    assert pub10.bound_replay_endpoint is not None
    for start in (0, 3, 5):
        assert replay(ctx, pub10.bound_replay_endpoint, start) == expect(range(6, 10))


def test_replay_beyond_the_end_is_just_the_end_marker(
    ctx: zmq.Context, pub10: ZmqEventPublisher
) -> None:
    assert pub10.bound_replay_endpoint is not None
    for start in (10, 11, 2**63, 2**64 - 1):
        assert replay(ctx, pub10.bound_replay_endpoint, start) == [END_MARKER]


def test_replay_frames_have_the_golden_structure(
    ctx: zmq.Context, pub10: ZmqEventPublisher
) -> None:
    golden = golden_frames("replay")
    assert pub10.bound_replay_endpoint is not None
    ours = replay(ctx, pub10.bound_replay_endpoint, 8)
    assert [len(f) for f in ours] == [len(f) for f in golden[-3:]] == [4, 4, 4]
    for frame in ours[:-1]:
        empty, topic, seq, payload = frame
        assert empty == b"" and topic == TOPIC.encode() and len(seq) == 8
        assert decode_batch(payload).data_parallel_rank == 0


def test_empty_buffer_answers_the_end_marker(
    ctx: zmq.Context, make_pub: Callable[..., ZmqEventPublisher]
) -> None:
    pub = make_pub("tcp://127.0.0.1:*", replay_endpoint="tcp://127.0.0.1:*")
    assert pub.bound_replay_endpoint is not None
    assert replay(ctx, pub.bound_replay_endpoint, 0) == [END_MARKER]


def test_malformed_requests_are_ignored_and_counted(
    ctx: zmq.Context,
    pub10: ZmqEventPublisher,
    closing: Callable[[zmq.Socket], zmq.Socket],
) -> None:
    assert pub10.bound_replay_endpoint is not None
    dealer = closing(ctx.socket(zmq.DEALER))
    dealer.connect(pub10.bound_replay_endpoint)
    dealer.send_multipart([b"", b"\x00" * 8, b"extra"])  # too many frames
    dealer.send(b"\x00" * 8)  # no empty delimiter frame
    wait_until(lambda: pub10.bad_replay_requests == 2)
    assert not dealer.poll(50)
    # The publisher still serves well-formed requests.
    dealer.send_multipart([b"", (9).to_bytes(8, "big")])
    assert recv_frames(dealer, 2) == expect(range(9, 10))
    assert pub10.replay_requests == 1


@pytest.mark.parametrize(
    ("start", "seqs"),
    [
        (b"\x07", range(7, 10)),  # 1 byte: seq 7
        (b"", range(6, 10)),  # empty: seq 0
        (b"\x00" * 8 + b"\x09", range(9, 10)),  # 9 bytes, value 9
        (b"\x01" + b"\x00" * 8, range(0)),  # 9 bytes, value 2**64: beyond everything
        (b"\xff" * 4096, range(0)),
    ],
)
def test_start_seq_of_any_length_is_answered_like_vllm(
    ctx: zmq.Context,
    pub10: ZmqEventPublisher,
    closing: Callable[[zmq.Socket], zmq.Socket],
    start: bytes,
    seqs: range,
) -> None:
    """vLLM reads start_seq with ``int.from_bytes(frame, "big")`` whatever its length and
    answers; ignoring such a request left the client waiting for an end marker forever."""
    assert pub10.bound_replay_endpoint is not None
    dealer = closing(ctx.socket(zmq.DEALER))
    dealer.connect(pub10.bound_replay_endpoint)
    dealer.send_multipart([b"", start])
    assert recv_frames(dealer, len(seqs) + 1) == expect(seqs)
    assert (pub10.replay_requests, pub10.bad_replay_requests) == (1, 0)


def test_replay_socket_holds_two_full_replays_like_vllm(
    ctx: zmq.Context,
    make_pub: Callable[..., ZmqEventPublisher],
    closing: Callable[[zmq.Socket], zmq.Socket],
) -> None:
    """vLLM sizes the replay SNDHWM at 2 * (buffer_steps + 1) whatever ``hwm`` is: a ROUTER
    at its HWM drops frames silently, and ZMQ acks reads only every HWM/2 messages. With
    buffer_steps + 1 the second of two full replays lost its tail and end marker.

    inproc makes the pipe's capacity exact: the ROUTER's SNDHWM plus the DEALER's RCVHWM
    (1 here), and nothing is read until both requests were answered."""
    rep = inproc_name()
    pub = make_pub(inproc_name(), replay_endpoint=rep, topic=TOPIC, buffer_steps=50, hwm=0)
    for i in range(50):
        pub.publish(batch(i))
    wait_until(lambda: pub.published == 50)
    dealer = closing(ctx.socket(zmq.DEALER))
    dealer.setsockopt(zmq.RCVHWM, 1)
    dealer.connect(rep)
    dealer.send_multipart([b"", (0).to_bytes(8, "big")])
    dealer.send_multipart([b"", (0).to_bytes(8, "big")])
    wait_until(lambda: pub.replay_requests == 2)
    settle_dealer = closing(ctx.socket(zmq.DEALER))  # a third client: both were answered
    settle_dealer.connect(rep)
    settle_dealer.send_multipart([b"", (2**64 - 1).to_bytes(8, "big")])
    assert recv_frames(settle_dealer, 1) == [END_MARKER]
    assert recv_frames(dealer, 102) == expect(range(50)) * 2
    assert not dealer.poll(50)


def test_concurrent_clients_each_get_their_own_answer(
    ctx: zmq.Context,
    pub10: ZmqEventPublisher,
    closing: Callable[[zmq.Socket], zmq.Socket],
) -> None:
    assert pub10.bound_replay_endpoint is not None
    dealers = [closing(ctx.socket(zmq.DEALER)) for _ in range(3)]
    for d, start in zip(dealers, (6, 8, 99), strict=True):
        d.connect(pub10.bound_replay_endpoint)
        d.send_multipart([b"", start.to_bytes(8, "big")])
    assert recv_frames(dealers[0], 5) == expect(range(6, 10))
    assert recv_frames(dealers[1], 3) == expect(range(8, 10))
    assert recv_frames(dealers[2], 1) == [END_MARKER]


def test_long_replay_is_not_cut_by_the_default_hwm(
    ctx: zmq.Context, make_pub: Callable[..., ZmqEventPublisher]
) -> None:
    """A replay of more batches than ZMQ's default HWM (1000) arrives whole."""
    pub = make_pub("tcp://127.0.0.1:*", replay_endpoint="tcp://127.0.0.1:*", buffer_steps=3000)
    for i in range(2500):
        pub.publish(KVEventBatch(ts=float(i), events=[AllBlocksCleared()]))
    wait_until(lambda: pub.published == 2500)
    assert pub.bound_replay_endpoint is not None
    frames = replay(ctx, pub.bound_replay_endpoint, 0)
    assert [seq_of(f) for f in frames[:-1]] == list(range(2500))


def test_live_round_trip_then_replay_fills_the_head(
    ctx: zmq.Context,
    make_pub: Callable[..., ZmqEventPublisher],
    closing: Callable[[zmq.Socket], zmq.Socket],
) -> None:
    """What a subscriber does: take live frames, replay whatever it missed before them."""
    pub = make_pub("tcp://127.0.0.1:*", replay_endpoint="tcp://127.0.0.1:*", topic=TOPIC)
    assert pub.bound_endpoint and pub.bound_replay_endpoint
    sub = closing(subscribe(ctx, pub.bound_endpoint))
    settle(ctx, pub)
    for i in range(20):
        pub.publish(batch(i))
    live = recv_through(sub, 19)
    first = seq_of(live[0])
    assert [seq_of(f) for f in live] == list(range(first, 20))
    want = expect(range(20))
    assert [[b"", *f] for f in live] == want[first:20]
    assert replay(ctx, pub.bound_replay_endpoint, 0) == want
