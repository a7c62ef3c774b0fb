"""Client side of the publisher protocol for tests: SUB, replay DEALER, golden frames.

Everything waits on sockets with a deadline; nothing sleeps for a fixed time.
"""

from __future__ import annotations

import socket
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import msgspec
import zmq

from publisher import ZmqEventPublisher
from schemas import REPLAY_END_SEQ, KVEventBatch, decode_batch

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vllm-0.33"
GOLDEN_TOPIC = "kv@worker-0@demo"
GOLDEN_ORDER = [
    "single_group_ints",
    "hybrid_groups",
    "offload_cpu_bytes_hashes",
    "lora_salt_extra_keys",
    "all_cleared",
]
DEADLINE_S = 10.0
END_MARKER = [b"", b"", REPLAY_END_SEQ, b""]


def golden_frames(name: str) -> list[list[bytes]]:
    return msgspec.msgpack.decode((FIXTURES / "frames" / f"{name}.msgpack").read_bytes())


def golden_batches() -> list[KVEventBatch]:
    """The events/ payloads decoded, in the order the live frames were captured."""
    return [decode_batch((FIXTURES / "events" / f"{n}.msgpack").read_bytes()) for n in GOLDEN_ORDER]


def inproc_name() -> str:
    return f"inproc://kvroute-test-{uuid.uuid4().hex}"


def wait_until(cond: Callable[[], bool], timeout: float = DEADLINE_S) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met before the deadline")
        time.sleep(0.005)


def free_port_pair() -> int:
    """A port p such that p and p+1 are both free on loopback right now."""
    for _ in range(50):
        with socket.socket() as a:
            a.bind(("127.0.0.1", 0))
            port = a.getsockname()[1]
            if port >= 65535:
                continue
            with socket.socket() as b:
                try:
                    b.bind(("127.0.0.1", port + 1))
                except OSError:
                    continue
        return int(port)
    raise RuntimeError("no two consecutive free ports")


def recv_frames(sock: zmq.Socket, n: int, timeout: float = DEADLINE_S) -> list[list[bytes]]:
    """Receive exactly ``n`` multipart messages or fail at the deadline."""
    out: list[list[bytes]] = []
    deadline = time.monotonic() + timeout
    while len(out) < n:
        left_ms = int((deadline - time.monotonic()) * 1000)
        if left_ms <= 0 or not sock.poll(left_ms):
            raise AssertionError(f"received {len(out)} of {n} messages before the deadline")
        out.append(sock.recv_multipart())
    return out


def recv_through(sock: zmq.Socket, last_seq: int) -> list[list[bytes]]:
    """Live frames up to and including seq ``last_seq``, from the first that arrived (a SUB
    over tcp may miss the head: the PUB/SUB slow joiner); each frame within the deadline."""
    got = recv_frames(sock, 1)
    while seq_of(got[-1]) < last_seq:
        got += recv_frames(sock, 1)
    return got


def nothing_more(sock: zmq.Socket, wait_ms: int = 50) -> bool:
    return not sock.poll(wait_ms)


def subscribe(ctx: zmq.Context, endpoint: str, topic: bytes = b"") -> zmq.Socket:
    """A SUB connected to ``endpoint``; for tcp, returns once the handshake completed."""
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, topic)
    sub.setsockopt(zmq.LINGER, 0)
    if not endpoint.startswith("tcp://"):
        sub.connect(endpoint)
        return sub
    monitor = sub.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED)
    try:
        sub.connect(endpoint)
        if not monitor.poll(int(DEADLINE_S * 1000)):
            raise AssertionError(f"SUB never connected to {endpoint}")
        monitor.recv_multipart()
    finally:
        sub.disable_monitor()
        monitor.close(linger=0)
    return sub


def replay(
    ctx: zmq.Context, endpoint: str, start_seq: int, timeout: float = DEADLINE_S
) -> list[list[bytes]]:
    """Ask a replay ROUTER for ``start_seq`` onwards; every frame up to the end marker."""
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.connect(endpoint)
    try:
        dealer.send_multipart([b"", start_seq.to_bytes(8, "big")])
        out: list[list[bytes]] = []
        deadline = time.monotonic() + timeout
        while not out or out[-1] != END_MARKER:
            left_ms = int((deadline - time.monotonic()) * 1000)
            if left_ms <= 0 or not dealer.poll(left_ms):
                raise AssertionError(f"no end marker after {len(out)} replay frames")
            out.append(dealer.recv_multipart())
        return out
    finally:
        dealer.close()


def settle(ctx: zmq.Context, pub: ZmqEventPublisher) -> None:
    """A replay round trip: the publisher thread and ZMQ's I/O thread both ran since.

    After ``subscribe`` this makes it (practically) certain the PUB socket has seen the
    new subscription; tests over tcp still only rely on what is guaranteed.
    """
    assert pub.bound_replay_endpoint is not None
    assert replay(ctx, pub.bound_replay_endpoint, 2**64 - 1) == [END_MARKER]


def seq_of(frame: list[bytes]) -> int:
    return int.from_bytes(frame[-2], "big")
