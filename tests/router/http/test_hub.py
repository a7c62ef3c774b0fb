"""The SSE hub over real HTTP (uvicorn on a free port): one computation per tick for any
number of clients, bounded per-client queues, prompt shutdown."""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
import threading
import time
from typing import Any

import pytest
import uvicorn
from _helpers import DEADLINE_S, read_n, serve_app, sse_events, wait_until
from fastapi import FastAPI
from fastapi.responses import StreamingResponse

from router.http.hub import StreamHub, TooManyClients, sse_message
from router.http.stream import close_streams_on_exit, close_streams_soon
from router.netutil import listen_socket


def tiny_app(hub: StreamHub) -> FastAPI:
    app = FastAPI()
    app.state.stream_hub = hub

    @app.get("/s")
    async def stream() -> StreamingResponse:
        try:
            sub = hub.subscribe()
        except TooManyClients:
            return StreamingResponse(iter([b"busy"]), status_code=503)
        return StreamingResponse(hub.stream(sub), media_type="text/event-stream")

    return app


class Counting:
    """A summary function that counts its calls (and can fail the first few)."""

    def __init__(self, fail_first: int = 0) -> None:
        self.calls = 0
        self.fail_first = fail_first

    async def __call__(self) -> dict[str, Any]:
        self.calls += 1
        if self.calls <= self.fail_first:
            raise RuntimeError("index unavailable")
        return {"n": self.calls}


# ------------------------------------------------------------------------- the hub


def test_sse_message_format():
    msg = sse_message("summary", {"a": "x\ny"}, 7)
    assert msg == b'id: 7\nevent: summary\ndata: {"a":"x\\ny"}\n\n'


async def test_many_http_clients_share_one_computation_per_tick():
    fn = Counting()
    hub = StreamHub(fn, period_s=0.05)
    async with serve_app(tiny_app(hub)) as client:
        results = await asyncio.gather(*(read_n(client, 5) for _ in range(8)))
    seen: dict[int, int] = {}
    for messages in results:
        ids = [msg_id for msg_id, _ in messages]
        assert ids == sorted(ids) and len(set(ids)) == 5
        for msg_id, data in messages:
            # Every client that got tick i got the very same computation.
            assert seen.setdefault(msg_id, data["n"]) == data["n"]
    assert sum(len(m) for m in results) == 40
    assert fn.calls == hub.computations
    # One computation per tick, not per client: far fewer than the 40 messages served.
    assert hub.computations <= max(seen) + 1 < 40


async def test_new_client_gets_the_fresh_summary_without_a_new_computation():
    fn = Counting()
    hub = StreamHub(fn, period_s=30.0)  # no periodic tick during the test
    first = hub.subscribe()
    got = await asyncio.wait_for(first.queue.get(), DEADLINE_S)  # computed at once
    second = hub.subscribe()
    assert second.queue.get_nowait() == got
    assert fn.calls == 1 and hub.clients == 2
    await hub.close()
    assert first.queue.get_nowait() is None and second.queue.get_nowait() is None


async def test_fifty_clients_cost_one_computation_per_tick():
    fn = Counting()
    hub = StreamHub(fn, period_s=0.01, queue_size=64)
    subs = [hub.subscribe() for _ in range(50)]
    await wait_until(lambda: all(s.queue.qsize() >= 5 for s in subs), "5 ticks")
    received = [[s.queue.get_nowait() for _ in range(s.queue.qsize())] for s in subs]
    await hub.close()
    assert all(len(r) >= 5 for r in received)
    assert fn.calls == hub.computations == hub.ticks
    assert fn.calls <= max(len(r) for r in received) + 1


async def test_slow_client_is_dropped_and_never_buffered_beyond_its_queue():
    hub = StreamHub(Counting(), period_s=0.01, queue_size=4)
    slow = hub.subscribe()  # never read
    fast = hub.subscribe()
    fast_got: list[bytes] = []

    async def read_fast() -> None:
        async for message in fast.messages():
            fast_got.append(message)

    reader = asyncio.create_task(read_fast())
    await wait_until(lambda: slow.dropped, "slow client dropped")
    assert slow.queue.qsize() == 1 and slow.queue.get_nowait() is None  # only the end mark
    assert hub.dropped == 1 and hub.clients == 1
    n = len(fast_got)
    await wait_until(lambda: len(fast_got) >= n + 3, "fast client keeps receiving")
    assert slow.queue.qsize() == 0  # nothing more was queued for the dropped client
    await hub.close()
    await asyncio.wait_for(reader, DEADLINE_S)


async def test_disconnect_unsubscribes_and_idle_hub_stops_computing():
    fn = Counting()
    hub = StreamHub(fn, period_s=0.05)
    async with serve_app(tiny_app(hub)) as client:
        await read_n(client, 2)  # leaves the stream (closes the response)
        await wait_until(lambda: hub.clients == 0, "client unsubscribed")
        await wait_until(lambda: not hub.running, "ticker stopped")
        calls = fn.calls
        # A new client restarts the ticker.
        assert len(await read_n(client, 1)) == 1
        assert fn.calls > calls


async def test_close_ends_open_streams_promptly():
    hub = StreamHub(Counting(), period_s=30.0)
    async with serve_app(tiny_app(hub)) as client:
        done = asyncio.Event()
        got: list[int | None] = []

        async def listen() -> None:
            async with client.stream("GET", "/s") as r:
                async for _event, msg_id, _data in sse_events(r):
                    got.append(msg_id)
            done.set()

        task = asyncio.create_task(listen())
        await wait_until(lambda: got, "first summary")
        close_streams_soon(hub)  # what the uvicorn signal hook does
        await asyncio.wait_for(done.wait(), DEADLINE_S)
        await task
        with pytest.raises(TooManyClients):
            hub.subscribe()


def test_uvicorn_exit_hook_ends_streams_so_shutdown_is_prompt():
    """uvicorn waits for open responses before shutting down; an SSE response never ends
    by itself, so the signal handler must close the streams first. (The server runs in a
    thread, as a signal handler would reach it from outside the event loop; uvicorn only
    re-raises captured signals when it owns the main thread.)"""
    hub = StreamHub(Counting(), period_s=30.0)
    app = tiny_app(hub)
    sock = listen_socket()
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    close_streams_on_exit(server, app)
    thread = threading.Thread(target=lambda: asyncio.run(server.serve(sockets=[sock])), daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + DEADLINE_S
        while not server.started and time.monotonic() < deadline:
            time.sleep(0.01)
        # A raw socket: the client keeps the stream open and never closes it itself.
        with socket.create_connection(("127.0.0.1", port), timeout=DEADLINE_S) as client:
            client.sendall(b"GET /s HTTP/1.1\r\nHost: x\r\nAccept: text/event-stream\r\n\r\n")
            received = b""
            while b"data:" not in received:
                received += client.recv(4096)
            server.handle_exit(signal.SIGTERM, None)  # what SIGTERM runs
            thread.join(DEADLINE_S)
            assert not thread.is_alive(), "uvicorn still waits for the stream"
    finally:
        server.should_exit = True
        thread.join(DEADLINE_S)
        sock.close()
    assert hub.clients == 0


async def test_failing_summary_is_logged_rate_limited_and_stream_recovers(
    caplog: pytest.LogCaptureFixture,
):
    # A summary failing every tick is logged for the first few ticks, then at most once a
    # minute (router.ratelimited_log), not once per process nor once per tick.
    fn = Counting(fail_first=8)
    hub = StreamHub(fn, period_s=0.01)
    sub = hub.subscribe()
    with caplog.at_level(logging.ERROR, logger="router.http.hub"):
        message = await asyncio.wait_for(sub.queue.get(), DEADLINE_S)
    assert message is not None and b'"n":9' in message
    assert hub.errors == 8
    assert len([r for r in caplog.records if "stream summary failed" in r.message]) == 5
    await hub.close()


async def test_max_clients():
    """The limit is enforced and every refusal counted (``kvroute_stream_refused_clients``)."""
    hub = StreamHub(Counting(), period_s=30.0, max_clients=2)
    a = hub.subscribe()
    hub.subscribe()
    for _ in range(3):
        with pytest.raises(TooManyClients):
            hub.subscribe()
    assert (hub.clients, hub.refused) == (2, 3)
    hub.unsubscribe(a)  # a slot freed is a slot to take
    hub.subscribe()
    assert hub.refused == 3
    await hub.close()
