"""The proxy's lean HTTP/1.1 client against real loopback servers: keep-alive reuse,
chunked streaming, an idle socket the server closed, connect errors, silence, and a
body cut short. The servers are plain asyncio servers speaking raw HTTP/1.1."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from router.netutil import free_ports
from router.proxy.upstream import UpstreamError, UpstreamPool

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def read_request(reader: asyncio.StreamReader) -> bytes | None:
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    return head + await reader.readexactly(length)


async def serve(handler: Handler) -> tuple[asyncio.Server, str]:
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, f"http://127.0.0.1:{port}/v1/completions"


def pool(read_timeout: float = 10.0) -> UpstreamPool:
    return UpstreamPool(connect_timeout=2.0, read_timeout=read_timeout)


async def test_keep_alive_connection_is_reused_and_body_is_forwarded() -> None:
    connections = 0
    seen: list[bytes] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        while True:
            try:
                req = await read_request(reader)
            except asyncio.IncompleteReadError:
                break
            assert req is not None
            seen.append(req)
            body = b'{"ok": %d}' % len(seen)
            writer.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                b"content-length: %d\r\n\r\n%s" % (len(body), body)
            )
            await writer.drain()
        writer.close()

    server, url = await serve(handler)
    p = pool()
    try:
        for i in range(3):
            r = await p.post(url, b'{"n": %d}' % i, [(b"content-type", b"application/json")])
            assert r.status == 200 and r.header(b"content-type") == b"application/json"
            assert await r.read() == b'{"ok": %d}' % (i + 1)
            r.close()
        assert connections == 1
        assert seen[2].endswith(b'{"n": 2}') and b"content-length: 8" in seen[2]
    finally:
        p.close()
        server.close()


async def test_chunked_stream_arrives_chunk_by_chunk() -> None:
    release = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            b"transfer-encoding: chunked\r\n\r\n"
        )
        writer.write(b"9\r\ndata: 1\n\n\r\n")
        await writer.drain()
        await release.wait()  # the second chunk only after the first was received
        writer.write(b"9\r\ndata: 2\n\n\r\n0\r\n\r\n")
        await writer.drain()

    server, url = await serve(handler)
    p = pool()
    try:
        r = await p.post(url, b"{}", [])
        chunks = r.chunks()
        assert await chunks.__anext__() == b"data: 1\n\n"
        release.set()
        assert [c async for c in chunks] == [b"data: 2\n\n"]
        r.close()
    finally:
        p.close()
        server.close()


async def test_idle_socket_closed_by_the_server_is_replaced() -> None:
    connections = 0

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        await read_request(reader)
        # keep-alive promised, then the socket is closed (an engine's idle timeout)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
        await writer.drain()
        writer.close()

    server, url = await serve(handler)
    p = pool()
    try:
        for _ in range(3):
            r = await p.post(url, b"{}", [])
            assert await r.read() == b"ok"
            r.close()
            await asyncio.sleep(0)  # connection_lost may or may not have run yet
        assert connections == 3
    finally:
        p.close()
        server.close()


async def test_connect_error_silence_and_a_cut_body_raise() -> None:
    (dead,) = free_ports(1)
    p = pool(read_timeout=0.3)
    with pytest.raises(UpstreamError) as info:
        await p.post(f"http://127.0.0.1:{dead}/v1/completions", b"{}", [])
    assert info.value.before_response

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        await asyncio.sleep(5)

    server, url = await serve(silent)
    with pytest.raises(UpstreamError, match="no data") as info:
        await p.post(url, b"{}", [])
    assert info.value.before_response
    server.close()

    async def cut(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\npartial")
        await writer.drain()
        writer.close()

    server, url = await serve(cut)
    try:
        r = await p.post(url, b"{}", [])
        with pytest.raises(UpstreamError) as info:
            await r.read()
        assert not info.value.before_response
        r.close()
        assert not p._idle.get(p.split(url)[0])  # a broken connection is not pooled
    finally:
        p.close()
        server.close()


async def test_get_reuses_the_connection_and_its_own_timeout_bounds_silence() -> None:
    """Health checks go through ``get``: a bodiless GET on a pooled keep-alive
    connection, and a server that stays silent fails after the call's timeout, not the
    pool's (10 s here)."""
    connections = 0
    seen: list[bytes] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        while True:
            try:
                req = await read_request(reader)
            except asyncio.IncompleteReadError:
                break
            assert req is not None
            seen.append(req)
            if b"/silent" in req:
                continue  # never answers
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
            await writer.drain()
        writer.close()

    server, url = await serve(handler)
    base = url.rsplit("/v1/", 1)[0]
    p = pool(read_timeout=10.0)
    try:
        for _ in range(3):
            assert await p.get(f"{base}/health", timeout=5.0) == (200, b"ok")
        assert connections == 1
        assert seen[0].startswith(b"GET /health HTTP/1.1\r\n")
        assert b"content-length" not in seen[0].lower()
        with pytest.raises(UpstreamError, match=r"no data from upstream for 0\.2 s"):
            await p.get(f"{base}/silent", timeout=0.2)
    finally:
        p.close()
        server.close()
