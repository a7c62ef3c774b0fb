"""Our publisher reproduces vLLM 0.33's frames byte for byte (live and replay).

The golden batches are the events/ fixtures decoded; three have no DP rank and vLLM's
publisher (rank 0) stamped 0 on them, one carries rank 1 and kept it. Over inproc the
subscription is in place before the first send, so every live frame is compared; over
tcp a SUB may miss the first frames (the PUB/SUB slow joiner), so the test takes what
arrived live and replays the rest -- all of it must equal the golden frames.
"""

from __future__ import annotations

from collections.abc import Callable

import zmq
from _zmq_client import (
    GOLDEN_TOPIC,
    golden_batches,
    golden_frames,
    inproc_name,
    nothing_more,
    recv_frames,
    recv_through,
    replay,
    seq_of,
    settle,
    subscribe,
    wait_until,
)

from publisher import ZmqEventPublisher
from schemas import decode_batch


def test_live_and_replay_frames_equal_vllm_over_inproc(
    ctx: zmq.Context,
    make_pub: Callable[..., ZmqEventPublisher],
    closing: Callable[[zmq.Socket], zmq.Socket],
) -> None:
    endpoint, replay_endpoint = inproc_name(), inproc_name()
    pub = make_pub(endpoint, replay_endpoint=replay_endpoint, topic=GOLDEN_TOPIC, start=False)
    sub = closing(subscribe(ctx, endpoint))  # connect-before-bind: subscribed at bind
    pub.start()
    batches = golden_batches()
    assert [b.data_parallel_rank for b in batches] == [None, 0, 1, None, None]
    for batch in batches:
        pub.publish(batch)
    assert recv_frames(sub, 5) == golden_frames("live")
    assert nothing_more(sub)
    # publish() stamps the publisher's rank on the caller's batch, as vLLM does.
    assert [b.data_parallel_rank for b in batches] == [0, 0, 1, 0, 0]
    wait_until(lambda: pub.published == 5)
    assert replay(ctx, replay_endpoint, 2) == golden_frames("replay")


def test_live_and_replay_frames_equal_vllm_over_tcp(
    ctx: zmq.Context,
    make_pub: Callable[..., ZmqEventPublisher],
    closing: Callable[[zmq.Socket], zmq.Socket],
) -> None:
    pub = make_pub("tcp://127.0.0.1:*", replay_endpoint="tcp://127.0.0.1:*", topic=GOLDEN_TOPIC)
    assert pub.bound_endpoint and pub.bound_replay_endpoint
    sub = closing(subscribe(ctx, pub.bound_endpoint, GOLDEN_TOPIC.encode()))
    settle(ctx, pub)
    for batch in golden_batches():
        pub.publish(batch)
    live = golden_frames("live")
    got = recv_through(sub, 4)
    first = seq_of(got[0])
    assert got == live[first:]
    assert replay(ctx, pub.bound_replay_endpoint, 0)[:-1] == [[b"", *f] for f in live]
    assert replay(ctx, pub.bound_replay_endpoint, 2) == golden_frames("replay")


def test_replayed_payloads_decode_like_live_ones(
    ctx: zmq.Context, make_pub: Callable[..., ZmqEventPublisher]
) -> None:
    pub = make_pub("tcp://127.0.0.1:*", replay_endpoint="tcp://127.0.0.1:*", topic="t")
    batches = golden_batches()
    for batch in batches:
        pub.publish(batch)
    wait_until(lambda: pub.published == 5)
    assert pub.bound_replay_endpoint is not None
    frames = replay(ctx, pub.bound_replay_endpoint, 0)
    assert [decode_batch(f[3]) for f in frames[:-1]] == batches
    assert [len(f) for f in frames] == [4] * 6
    assert all(f[1] == b"t" for f in frames[:-1])
