"""The replay client: ask a publisher's ROUTER for every buffered batch from a seq on.

Protocol (docs/design.md#wire-format): send ``[b"", start_seq (8B BE)]`` on a DEALER; the
publisher answers ``[b"", topic, seq, payload]`` per buffered batch with
``seq >= start_seq`` and then the end marker ``[b"", b"", -1 (8B signed BE), b""]``
(SGLang up to 0.5.21: the same without the topic frame, read alike).

What an answer may hold is checked here, because whatever seq a replayed frame carries
becomes the worker's last applied seq: one frame far ahead (a liar, a bug, a corrupted
seq) would make every later live batch look like a duplicate. A publisher's buffer is a
run of contiguous seqs (``publisher.zmq_publisher`` and vLLM's alike), so a reply is kept
only if its seq is ``>= start_seq`` and, after the first kept one, exactly the next seq;
anything else is off the protocol, skipped and counted with the malformed replies. A
caller that knows how far the stream has gone passes ``upto``: the answer is read up to
that seq and no further (later frames reach the caller live).

Why a fresh DEALER per request: a timed-out request may still be answered later, and a
socket of its own guarantees those late frames can never be mistaken for the answer to
the next request. Replays are rare (a gap, a restart), so one connect each costs nothing.

One client for the router (``request_replay``, asyncio) and ``kvroute tail``
(``request_replay_sync``, a thin caller running the same coroutine), so the protocol's
checks and bounds live in one place.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

import zmq
import zmq.asyncio

from schemas import REPLAY_END_SEQ

log = logging.getLogger(__name__)

_END = [b"", b"", REPLAY_END_SEQ, b""]
# SGLang up to 0.5.21 answers without the topic frame: ``[b"", seq, payload]`` per batch,
# then ``[b"", -1, b""]``.
_END_BARE = [b"", REPLAY_END_SEQ, b""]


DEFAULT_MAX_FRAMES = 100_000
DEFAULT_MAX_BYTES = 256 << 20
# Seqs are 8-byte unsigned: the last one has nothing after it.
MAX_SEQ = (1 << 64) - 1


class ReplayFailed(Exception):
    """No complete answer: timeout, a socket error, or a peer off the protocol.

    ``frames`` and ``malformed`` hold what arrived before the failure (a debugging tool
    shows them; the router discards them, as an incomplete answer proves nothing).
    """

    def __init__(
        self, message: str, frames: list[ReplayFrame] | None = None, malformed: int = 0
    ) -> None:
        super().__init__(message)
        self.frames: list[ReplayFrame] = frames if frames is not None else []
        self.malformed = malformed


class ReplayTooLarge(ReplayFailed):
    """The answer exceeded the frame or byte bound (the caller counts it)."""


@dataclass(frozen=True, slots=True)
class ReplayFrame:
    seq: int
    topic: bytes | None  # None: the publisher's answer has no topic frame (old SGLang)
    payload: bytes


async def request_replay(
    ctx: zmq.asyncio.Context,
    endpoint: str,
    start_seq: int,
    *,
    timeout_s: float,
    max_frames: int = DEFAULT_MAX_FRAMES,
    max_bytes: int = DEFAULT_MAX_BYTES,
    upto: int | None = None,
) -> tuple[list[ReplayFrame], int]:
    """Return ``(frames, malformed)``: the buffered frames in order, and how many replies
    were off the protocol (skipped, counted by the caller): not the replay shape, or a seq
    below ``start_seq`` or not following the previous kept one (module docstring).
    ``upto``: keep no frame past this seq; the first one past it ends the answer.

    ``timeout_s`` bounds the wait for each reply (not the whole replay, which may be
    long), so a dead or silent publisher fails the request instead of wedging the caller.
    ``max_frames`` and ``max_bytes`` (replies and their bytes, skipped ones included)
    bound what a replay endpoint can make the router read: beyond either,
    ``ReplayTooLarge``. A single message larger than ``max_bytes`` is refused by ZMQ
    itself (``MAXMSGSIZE``: the peer is disconnected and the request times out). Every
    failure, socket creation included (the context may be out of sockets), is a
    ``ReplayFailed``: the caller's task must survive it.
    """
    frames: list[ReplayFrame] = []
    malformed = 0
    replies = read = 0
    sock: zmq.asyncio.Socket | None = None
    if not 0 <= start_seq <= MAX_SEQ:
        raise ReplayFailed(f"replay from {endpoint}: start seq {start_seq} is out of range")
    try:
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        # Unbounded in messages (a replay must not be cut silently by a HWM drop), bounded
        # in bytes by MAXMSGSIZE per message and by ``max_bytes`` over the answer below.
        sock.setsockopt(zmq.RCVHWM, 0)
        sock.setsockopt(zmq.MAXMSGSIZE, max_bytes)
        sock.connect(endpoint)
        await sock.send_multipart([b"", start_seq.to_bytes(8, "big")])
        while True:
            try:
                reply = await asyncio.wait_for(sock.recv_multipart(), timeout_s)
            except TimeoutError:
                raise ReplayFailed(
                    f"replay from {endpoint}: no reply within {timeout_s:g}s", frames, malformed
                ) from None
            if reply in (_END, _END_BARE):  # exactly: a batch may carry the seq 2**64-1
                return frames, malformed
            seq = -1  # not the replay shape
            # [b"", topic, seq, payload], or without the topic frame (SGLang <= 0.5.21)
            topic = reply[1] if len(reply) == 4 else None
            if len(reply) in (3, 4) and reply[0] == b"" and len(reply[-2]) == 8:
                seq = int.from_bytes(reply[-2], "big")
                if seq < start_seq or (frames and seq != frames[-1].seq + 1):
                    seq = -1  # behind what was asked, out of order, or a jump
                elif upto is not None and seq > upto:
                    return frames, malformed
            # Every reply counts against the bounds, skipped ones too: a peer sending
            # nothing but bad replies cannot hold the caller either.
            replies += 1
            read += sum(len(part) for part in reply)
            if replies > max_frames or read > max_bytes:
                raise ReplayTooLarge(
                    f"replay from {endpoint}: answer exceeds {max_frames} frames or "
                    f"{max_bytes} bytes; dropped",
                    frames,
                    malformed,
                )
            if seq < 0:
                malformed += 1
                continue
            frames.append(ReplayFrame(seq, topic, reply[-1]))
    except zmq.ZMQError as exc:
        raise ReplayFailed(f"replay from {endpoint}: {exc}", frames, malformed) from None
    finally:
        if sock is not None:
            sock.close(linger=0)


def request_replay_sync(
    ctx: zmq.Context[Any],
    endpoint: str,
    start_seq: int,
    *,
    timeout_s: float,
    max_frames: int = DEFAULT_MAX_FRAMES,
    max_bytes: int = DEFAULT_MAX_BYTES,
) -> tuple[list[ReplayFrame], int]:
    """``request_replay`` for a synchronous caller (``kvroute tail``), on ``ctx``'s
    sockets: the same coroutine, run on a private event loop. Not for use inside a
    running loop."""
    actx = zmq.asyncio.Context.shadow(ctx.underlying)
    return asyncio.run(
        request_replay(
            actx,
            endpoint,
            start_seq,
            timeout_s=timeout_s,
            max_frames=max_frames,
            max_bytes=max_bytes,
        )
    )
