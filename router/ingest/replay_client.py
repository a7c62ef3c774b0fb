"""The replay client: ask a publisher's ROUTER for every buffered batch from a seq on.

Protocol (docs/design.md#wire-format): send ``[b"", start_seq (8B BE)]`` on a DEALER; the
publisher answers ``[b"", topic, seq, payload]`` per buffered batch with
``seq >= start_seq`` and then the end marker ``[b"", b"", -1 (8B signed BE), b""]``.

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


DEFAULT_MAX_FRAMES = 100_000
DEFAULT_MAX_BYTES = 256 << 20


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
    topic: bytes
    payload: bytes


async def request_replay(
    ctx: zmq.asyncio.Context,
    endpoint: str,
    start_seq: int,
    *,
    timeout_s: float,
    max_frames: int = DEFAULT_MAX_FRAMES,
    max_bytes: int = DEFAULT_MAX_BYTES,
) -> tuple[list[ReplayFrame], int]:
    """Return ``(frames, malformed)``: the buffered frames in order, and how many replies
    did not have the replay shape (skipped, counted by the caller).

    ``timeout_s`` bounds the wait for each reply (not the whole replay, which may be
    long), so a dead or silent publisher fails the request instead of wedging the caller.
    ``max_frames`` and ``max_bytes`` (payload bytes kept) bound what a replay endpoint can
    make the router hold: beyond either, ``ReplayTooLarge``. A single message larger than
    ``max_bytes`` is refused by ZMQ itself (``MAXMSGSIZE``: the peer is disconnected and
    the request times out). Every failure, socket creation included (the context may be
    out of sockets), is a ``ReplayFailed``: the caller's task must survive it.
    """
    frames: list[ReplayFrame] = []
    malformed = 0
    kept = 0
    sock: zmq.asyncio.Socket | None = None
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
            if len(reply) == 4 and reply[0] == b"" and reply[2] == REPLAY_END_SEQ:
                return frames, malformed
            if len(reply) != 4 or reply[0] != b"" or len(reply[2]) != 8:
                malformed += 1
                continue
            kept += len(reply[1]) + len(reply[3])
            if len(frames) >= max_frames or kept > max_bytes:
                raise ReplayTooLarge(
                    f"replay from {endpoint}: answer exceeds {max_frames} frames or "
                    f"{max_bytes} bytes; dropped",
                    frames,
                    malformed,
                )
            frames.append(ReplayFrame(int.from_bytes(reply[2], "big"), reply[1], reply[3]))
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
