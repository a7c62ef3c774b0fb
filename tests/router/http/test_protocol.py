"""router/http/protocol.py: the response head goes out with the body in one write, never
later than the end of the loop iteration, and always before what follows it."""

from __future__ import annotations

import asyncio
import socket

import pytest
import uvicorn
from starlette.types import Receive, Scope, Send

from router.http.protocol import CoalescingHttpToolsProtocol, CoalescingTransport, protocol_class
from router.netutil import free_ports


class _Recorder(asyncio.Transport):
    """A transport that records each write (what the socket would get per syscall)."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.writes.append(bytes(data))

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def get_extra_info(self, name: str, default: object = None) -> object:
        return {"peername": ("127.0.0.1", 1)}.get(name, default)


async def test_head_and_body_leave_in_one_write() -> None:
    rec = _Recorder()
    t = CoalescingTransport(rec)
    t.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n")
    assert rec.writes == []  # held
    t.write(b"ok")
    assert rec.writes == [b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"]
    t.write(b"more")  # not a head: straight through
    assert rec.writes[-1] == b"more"
    assert t.get_extra_info("peername") == ("127.0.0.1", 1)  # delegated


async def test_a_lone_head_goes_out_by_the_end_of_the_loop_iteration() -> None:
    rec = _Recorder()
    t = CoalescingTransport(rec)
    t.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
    assert rec.writes == []
    await asyncio.sleep(0)  # one loop iteration: the call_soon flush ran
    assert rec.writes == [b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"]
    t.write(b"5\r\nhello\r\n")
    assert rec.writes[-1] == b"5\r\nhello\r\n"


async def test_close_flushes_a_held_head_first() -> None:
    rec = _Recorder()
    t = CoalescingTransport(rec)
    t.write(b"HTTP/1.1 400 Bad Request\r\nconnection: close\r\n\r\n")
    t.close()
    assert rec.writes == [b"HTTP/1.1 400 Bad Request\r\nconnection: close\r\n\r\n"]
    assert rec.closed
    await asyncio.sleep(0)
    assert len(rec.writes) == 1  # the scheduled flush finds nothing left


def test_serve_uses_the_coalescing_protocol() -> None:
    assert protocol_class() is CoalescingHttpToolsProtocol


async def _recv_until(sock: socket.socket, marker: bytes, timeout: float) -> bytes:
    loop = asyncio.get_running_loop()
    data = b""
    async with asyncio.timeout(timeout):
        while marker not in data:
            chunk = await loop.sock_recv(sock, 65536)
            if not chunk:
                break
            data += chunk
    return data


@pytest.mark.parametrize("stream", [False, True])
async def test_real_uvicorn_one_segment_and_no_delayed_stream_head(stream: bool) -> None:
    """Through a real uvicorn server: a plain response arrives whole; a streaming one's
    head arrives while its first chunk is still being waited for."""
    release = asyncio.Event()

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        if not stream:
            headers = [(b"content-type", b"text/plain"), (b"content-length", b"5")]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await send({"type": "http.response.body", "body": b"hello"})
            return
        start = {"type": "http.response.start", "status": 200, "headers": []}
        await send(start)
        await release.wait()  # the head must not wait for this
        await send({"type": "http.response.body", "body": b"late"})

    (port,) = free_ports(1)
    config = uvicorn.Config(
        app, host="127.0.0.1", port=port, http=protocol_class(), log_level="warning"
    )
    server = uvicorn.Server(config)
    serving = asyncio.create_task(server.serve())
    try:
        while not server.started:
            await asyncio.sleep(0.01)
        loop = asyncio.get_running_loop()
        sock = socket.socket()
        sock.setblocking(False)
        await loop.sock_connect(sock, ("127.0.0.1", port))
        try:
            await loop.sock_sendall(sock, b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
            if not stream:
                data = await _recv_until(sock, b"hello", 10)
                assert data.startswith(b"HTTP/1.1 200 OK\r\n") and data.endswith(b"\r\n\r\nhello")
            else:
                head = await _recv_until(sock, b"\r\n\r\n", 10)
                assert head.startswith(b"HTTP/1.1 200 OK\r\n")
                assert b"late" not in head
                release.set()
                rest = await _recv_until(sock, b"0\r\n\r\n", 10)
                assert b"late" in head + rest
        finally:
            sock.close()
    finally:
        server.should_exit = True
        await serving
