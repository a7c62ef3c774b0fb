"""uvicorn's httptools protocol with the response head and body sent in one write.

Why: uvicorn writes an ASGI ``http.response.start`` (status line + headers) to the socket
at once and the body in a second write. On loopback every ``write`` is a syscall that
runs the peer's TCP receive path and wakes it: for a proxied completion (a few hundred
bytes) that second syscall was a measurable part of the router's added latency
(docs/proxy.md, "Overhead"). Here the head is held until the next write on the
connection (the body, which for a ``Response`` follows in the same loop iteration) or,
at the latest, until the end of the current loop iteration (``call_soon``), so a
streaming response whose first chunk comes later is not delayed by more than that.
Order is preserved: held bytes always go out before anything written after them.
"""

from __future__ import annotations

import asyncio
from typing import Any

try:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
except ImportError:  # pragma: no cover - uvicorn without httptools: plain "auto"
    HttpToolsProtocol = None  # type: ignore[assignment, misc]

_HEAD = b"HTTP/1."


class CoalescingTransport:
    """Delegates to the real transport; holds a response head until the next write."""

    __slots__ = ("_held", "_loop", "_t")

    def __init__(self, transport: asyncio.Transport) -> None:
        self._t = transport
        self._held: bytes | None = None
        self._loop = asyncio.get_running_loop()

    def write(self, data: bytes | bytearray | memoryview) -> None:
        held = self._held
        if held is not None:
            self._held = None
            self._t.write(held + bytes(data))
        elif data[:7] == _HEAD:  # a status line: the body is about to follow
            self._held = bytes(data)
            self._loop.call_soon(self.flush)
        else:
            self._t.write(data)

    def flush(self) -> None:
        held = self._held
        if held is not None:
            self._held = None
            if not self._t.is_closing():
                self._t.write(held)

    def writelines(self, lines: Any) -> None:
        self.write(b"".join(lines))

    def close(self) -> None:
        self.flush()
        self._t.close()

    def write_eof(self) -> None:
        self.flush()
        self._t.write_eof()

    def __getattr__(self, name: str) -> Any:  # everything else: the real transport
        return getattr(self._t, name)


def protocol_class() -> type[asyncio.Protocol] | str:
    """What to give ``uvicorn.Config(http=...)``: the coalescing protocol, or ``"auto"``
    when httptools is not installed."""
    if HttpToolsProtocol is None:
        return "auto"
    return CoalescingHttpToolsProtocol


if HttpToolsProtocol is not None:

    class CoalescingHttpToolsProtocol(HttpToolsProtocol):
        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(CoalescingTransport(transport))  # type: ignore[arg-type]
