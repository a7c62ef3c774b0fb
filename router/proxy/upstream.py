"""A lean HTTP/1.1 keep-alive client for the proxy's forwarding hot path.

Why not httpx here: measured against a ``kvroute engine`` on loopback, an httpx request
costs ~0.4-0.5 ms more than the same request over a plain asyncio connection parsed by
``httptools`` (h11 header parsing in Python, anyio stream wrappers, the httpcore pool's
per-request scan). That was half of the proxy's added latency (docs/proxy.md). This
client does only what forwarding needs: one POST per pooled connection at a time,
``httptools`` (C, already installed with ``uvicorn[standard]``) parses the answer,
``Content-Length`` and chunked bodies are streamed as they arrive, and a connection goes
back to the pool only when its response was read to the end. Health checks use it too
(an httpx GET cost ~1.6 ms of the event loop's CPU: at 64 workers checked every 2 s that
was 5 % of the loop, in bursts that made the proxy's p99); the ``/tokenize``
pass-through keeps using httpx.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections import deque
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import httptools

# Hop-by-hop and framing headers, and the ones the ASGI server in front sets itself (a
# second ``date`` or ``server`` would make the answer carry two).
DROP = frozenset(
    {b"connection", b"keep-alive", b"transfer-encoding", b"content-length", b"date", b"server"}
)
_PAUSE_AT = 1 << 20  # buffered bytes from one upstream before reading pauses


class UpstreamError(Exception):
    """A forward failed. ``before_response``: no status line arrived yet."""

    def __init__(self, message: str, before_response: bool) -> None:
        super().__init__(message)
        self.before_response = before_response


class _Conn(asyncio.Protocol):
    """One keep-alive connection; carries at most one request at a time."""

    def __init__(self, pool: UpstreamPool, key: tuple[str, int]) -> None:
        self.pool, self.key = pool, key
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.closed = False
        self.lost = False  # the peer closed it (not us)
        self.idle_since = 0.0
        self.used = False
        self._reset()

    def _reset(self) -> None:
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.head_done = False
        self.keep_alive = False
        self.complete = False
        self.error: BaseException | None = None
        self.body: deque[bytes] = deque()
        self.buffered = 0
        self.paused = False
        self.waiter: asyncio.Future[None] | None = None

    # ------------------------------------------------------------ asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(UpstreamError(f"bad HTTP from upstream: {exc}", not self.head_done))
            self.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.lost = True
        if not self.complete:
            why = f"connection lost: {exc}" if exc else "connection closed by upstream"
            self._fail(UpstreamError(why, not self.head_done))

    # ------------------------------------------------------------ httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        if self.status < 200:  # 1xx (100 Continue): not the real answer yet
            self.headers = []
            return
        self.head_done = True
        self.keep_alive = self.parser.should_keep_alive()  # reset once the message ends
        self._wake()

    def on_body(self, body: bytes) -> None:
        self.body.append(body)
        self.buffered += len(body)
        if self.buffered > _PAUSE_AT and not self.paused and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        if self.status < 200:
            return
        self.complete = True
        self._wake()

    # ------------------------------------------------------------ plumbing
    def _wake(self) -> None:
        w = self.waiter
        if w is not None and not w.done():
            w.set_result(None)

    def _fail(self, exc: BaseException) -> None:
        if self.error is None:
            self.error = exc
        w = self.waiter
        if w is not None and not w.done():
            w.set_result(None)

    async def wait(self, timeout: float) -> None:
        """Until the next parser event (or error); ``timeout`` seconds of silence fail."""
        loop = asyncio.get_running_loop()
        self.waiter = loop.create_future()
        timer = loop.call_later(timeout, self._timed_out, timeout)
        try:
            await self.waiter
        finally:
            timer.cancel()
            self.waiter = None

    def _timed_out(self, timeout: float) -> None:
        self._fail(UpstreamError(f"no data from upstream for {timeout:g} s", not self.head_done))
        self.abort()

    def abort(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()

    def send(self, data: bytes) -> None:
        assert self.transport is not None
        self._reset()
        self.transport.write(data)


class UpstreamResponse:
    """The engine's status, headers and body (read all, or stream chunk by chunk)."""

    def __init__(self, conn: _Conn, read_timeout: float) -> None:
        self._conn = conn
        self._timeout = read_timeout
        self.status = conn.status
        self.headers = conn.headers
        self._released = False

    def header(self, name: bytes) -> bytes | None:
        for k, v in self.headers:
            if k.lower() == name:
                return v
        return None

    async def chunks(self) -> AsyncIterator[bytes]:
        c = self._conn
        while True:
            if c.body:
                data = b"".join(c.body) if len(c.body) > 1 else c.body[0]
                c.body.clear()
                c.buffered = 0
                if c.paused and c.transport is not None:
                    c.paused = False
                    c.transport.resume_reading()
                yield data
                continue
            if c.complete:
                return
            if c.error is not None:
                raise c.error
            await c.wait(self._timeout)

    async def read(self) -> bytes:
        return b"".join([chunk async for chunk in self.chunks()])

    def close(self) -> None:
        """Back to the pool when read to the end; otherwise the connection is closed
        (that is how an abandoned request is cancelled at the engine)."""
        if self._released:
            return
        self._released = True
        self._conn.pool.release(self._conn)


class UpstreamPool:
    """Idle keep-alive connections per (host, port); no limit on busy ones (the number of
    requests in flight through the proxy bounds them)."""

    def __init__(
        self,
        *,
        connect_timeout: float,
        read_timeout: float,
        max_idle_per_host: int = 256,
        idle_expiry_s: float = 4.0,
        api_key: str | None = None,
    ) -> None:
        # Sent as ``Authorization: Bearer`` on every request, in place of any the caller
        # passes (the engines' own key: ``engine_api_key``).
        self._auth = b"Bearer " + api_key.encode() if api_key else None
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self.max_idle = max_idle_per_host
        # Below uvicorn's default 5 s keep-alive: an engine closes idle sockets then.
        self.idle_expiry_s = idle_expiry_s
        self._idle: dict[tuple[str, int], list[_Conn]] = {}
        self._closed = False

    @staticmethod
    @functools.lru_cache(maxsize=4096)  # a few URLs per worker, parsed per request
    def split(url: str) -> tuple[tuple[str, int], bytes]:
        """``http://host:port/path`` -> ((host, port), b"/path")."""
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise UpstreamError(f"unsupported upstream URL {url!r} (http:// only)", True)
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        return (parts.hostname, parts.port or 80), path.encode()

    async def _connect(self, key: tuple[str, int], timeout: float) -> _Conn:
        loop = asyncio.get_running_loop()
        try:
            _, conn = await asyncio.wait_for(
                loop.create_connection(lambda: _Conn(self, key), key[0], key[1]), timeout
            )
        except TimeoutError:
            raise UpstreamError(f"connect to {key[0]}:{key[1]} timed out", True) from None
        except OSError as exc:
            raise UpstreamError(f"connect to {key[0]}:{key[1]} failed: {exc}", True) from None
        return conn

    def _take_idle(self, key: tuple[str, int]) -> _Conn | None:
        idle = self._idle.get(key)
        now = time.monotonic()
        while idle:
            conn = idle.pop()
            if conn.closed or now - conn.idle_since > self.idle_expiry_s:
                conn.abort()
                continue
            return conn
        return None

    def release(self, conn: _Conn) -> None:
        if self._closed or conn.closed or not conn.complete or conn.error is not None:
            conn.abort()
            return
        if not conn.keep_alive:
            conn.abort()
            return
        idle = self._idle.setdefault(conn.key, [])
        if len(idle) >= self.max_idle:
            conn.abort()
            return
        conn.idle_since = time.monotonic()
        idle.append(conn)

    async def post(
        self, url: str, body: bytes, headers: list[tuple[bytes, bytes]]
    ) -> UpstreamResponse:
        """Send ``body`` and return once the response head arrived."""
        return await self.request(b"POST", url, body, headers)

    async def get(self, url: str, timeout: float) -> tuple[int, bytes]:
        """A small GET read to the end (health checks, ``/v1/models``); ``timeout``
        bounds the connect and each wait for data."""
        response = await self.request(b"GET", url, None, [], timeout)
        try:
            return response.status, await response.read()
        finally:
            response.close()

    async def request(
        self,
        method: bytes,
        url: str,
        body: bytes | None,
        headers: list[tuple[bytes, bytes]],
        timeout: float | None = None,
    ) -> UpstreamResponse:
        """Send the request and return once the response head arrived. A reused
        connection that turns out closed before any answer is retried once on a fresh
        one. ``timeout`` (default: the pool's) bounds the connect and each read."""
        key, path = self.split(url)
        head = [method, b" ", path, b" HTTP/1.1\r\nhost: %s:%d\r\n" % (key[0].encode(), key[1])]
        auth = self._auth
        for name, value in headers:
            if auth is None or name != b"authorization":
                head += (name, b": ", value, b"\r\n")
        if auth is not None:
            head += (b"authorization: ", auth, b"\r\n")
        if body is None:
            head.append(b"\r\n")
            data = b"".join(head)
        else:
            head.append(b"content-length: %d\r\n\r\n" % len(body))
            data = b"".join(head) + body
        read_timeout = self.read_timeout if timeout is None else timeout
        connect_timeout = (
            self.connect_timeout if timeout is None else min(timeout, self.connect_timeout)
        )
        for attempt in range(2):
            conn = self._take_idle(key) if attempt == 0 else None
            reused = conn is not None
            if conn is None:
                conn = await self._connect(key, connect_timeout)
            try:
                conn.send(data)
                while not conn.head_done:
                    if conn.error is not None:
                        raise conn.error
                    await conn.wait(read_timeout)
            except UpstreamError as exc:
                conn.abort()
                if reused and exc.before_response and conn.lost:
                    continue  # the engine closed the idle socket: a fresh one
                raise
            except BaseException:
                conn.abort()
                raise
            return UpstreamResponse(conn, read_timeout)
        raise UpstreamError("upstream closed the connection twice", True)

    def close(self) -> None:
        self._closed = True
        for idle in self._idle.values():
            for conn in idle:
                conn.abort()
        self._idle.clear()
