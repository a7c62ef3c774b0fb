"""The replay client: ask a publisher's ROUTER for every buffered batch from a seq on.

Protocol (DESIGN §2): send ``[b"", start_seq (8B BE)]`` on a DEALER; the publisher answers
``[b"", topic, seq, payload]`` per buffered batch with ``seq >= start_seq`` and then the end
marker ``[b"", b"", -1 (8B signed BE), b""]``.

Why a fresh DEALER per request: a timed-out request may still be answered later, and a
socket of its own guarantees those late frames can never be mistaken for the answer to
the next request. Replays are rare (a gap, a restart), so one connect each costs nothing.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

import zmq
import zmq.asyncio

from schemas import REPLAY_END_SEQ

log = logging.getLogger(__name__)


class ReplayFailed(Exception):
    """No complete answer: timeout, or the peer spoke something other than the protocol."""


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
    max_frames: int = 1_000_000,
) -> tuple[list[ReplayFrame], int]:
    """Return ``(frames, malformed)``: the buffered frames in order, and how many replies
    did not have the replay shape (skipped, counted by the caller).

    ``timeout_s`` bounds the wait for each reply (not the whole replay, which may be
    long), so a dead or silent publisher fails the request instead of wedging the caller.
    """
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVHWM, 0)
    frames: list[ReplayFrame] = []
    malformed = 0
    try:
        sock.connect(endpoint)
        await sock.send_multipart([b"", start_seq.to_bytes(8, "big")])
        while len(frames) < max_frames:
            try:
                reply = await asyncio.wait_for(sock.recv_multipart(), timeout_s)
            except TimeoutError:
                raise ReplayFailed(
                    f"replay from {endpoint}: no reply within {timeout_s:.1f}s"
                ) from None
            if len(reply) == 4 and reply[0] == b"" and reply[2] == REPLAY_END_SEQ:
                return frames, malformed
            if len(reply) != 4 or reply[0] != b"" or len(reply[2]) != 8:
                malformed += 1
                continue
            frames.append(ReplayFrame(int.from_bytes(reply[2], "big"), reply[1], reply[3]))
        raise ReplayFailed(f"replay from {endpoint}: more than {max_frames} frames")
    except zmq.ZMQError as exc:
        raise ReplayFailed(f"replay from {endpoint}: {exc}") from None
    finally:
        sock.close(linger=0)
