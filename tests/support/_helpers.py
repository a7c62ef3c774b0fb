"""Test plumbing for the router's transport/HTTP tests: real sockets only.

* ``serve_app`` runs the FastAPI app under uvicorn in the test's event loop on a free
  loopback port (real HTTP, and the test can still look at the service object).
* ``FakeEngine`` is a publisher we fully control: an XPUB socket (so a test can wait
  until the router's subscription has arrived instead of sleeping) and a replay ROUTER
  speaking docs/design.md#wire-format, with seq numbers, drops and buffer size chosen by the test.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import uvicorn
import zmq
import zmq.asyncio
from fastapi import FastAPI

from router.netutil import free_port as free_port
from router.netutil import listen_socket
from schemas import REPLAY_END_SEQ, BlockRemoved, BlockStored, KVEventBatch, encode_batch

DEADLINE_S = 15.0


@dataclass(frozen=True)
class ScoreStub:
    """A scorer row as the routing core reads it (``worker_id``, hits, score): routing
    tests feed these instead of running an index."""

    worker_id: str
    hit_tokens: int = 0
    hit_tokens_gpu: int = 0
    score: float = 0.0


def poll(
    predicate: Callable[[], Any],
    what: str = "",
    timeout: float = DEADLINE_S,
    interval: float = 0.02,
) -> Any:
    """Call ``predicate`` until truthy (for synchronous tests driving real processes);
    fail with ``what`` at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or predicate}")
        time.sleep(interval)


async def wait_until(
    predicate: Callable[[], Any | Awaitable[Any]], what: str = "", timeout: float = DEADLINE_S
) -> Any:
    """Poll ``predicate`` (sync or async) until truthy; fail with ``what`` at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or predicate}")
        await asyncio.sleep(0.01)


def stop_process(
    proc: subprocess.Popen[Any], grace_s: float = 15.0, kill_wait_s: float = 5.0
) -> int:
    """SIGTERM a child and wait ``grace_s`` for a clean exit, then SIGKILL; its exit code."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=kill_wait_s)
    return int(proc.returncode)


@contextlib.asynccontextmanager
async def serve_app(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    """uvicorn on 127.0.0.1:<free port> in this loop; yields a client bound to it."""
    sock = listen_socket()
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, log_level="warning", lifespan="on", access_log=False)
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        await wait_until(lambda: server.started or task.done(), what="uvicorn start")
        if task.done():
            task.result()
            raise AssertionError("uvicorn exited at start-up")
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=20) as client:
            yield client
    finally:
        hub = getattr(app.state, "stream_hub", None)
        if hub is not None:  # open SSE responses would hold uvicorn's shutdown
            await hub.close()
        server.should_exit = True
        with contextlib.suppress(Exception):
            await asyncio.wait_for(task, 20)
        sock.close()


@contextlib.contextmanager
def serve_in_thread(app: FastAPI, start_s: float = 30) -> Iterator[str]:
    """uvicorn on 127.0.0.1:<free port> in a thread of its own (for tests whose client
    runs its own loop); yields the base URL."""
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + start_s
        while not server.started:
            assert time.monotonic() < deadline and thread.is_alive(), "uvicorn did not start"
            time.sleep(0.01)
        yield f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(10)


def stored(
    hashes: list[int],
    tokens: list[int],
    parent: int | None = None,
    *,
    block_size: int = 4,
    group: int | None = None,
    medium: str | None = "GPU",
    kind: str | None = None,
    window: int | None = None,
) -> BlockStored:
    return BlockStored(
        block_hashes=hashes,
        parent_block_hash=parent,
        token_ids=tokens,
        block_size=block_size,
        lora_id=None,
        medium=medium,
        lora_name=None,
        group_idx=group,
        kv_cache_spec_kind=kind,
        kv_cache_spec_sliding_window=window,
    )


def removed(hashes: list[int], medium: str = "GPU", group: int | None = None) -> BlockRemoved:
    return BlockRemoved(block_hashes=hashes, medium=medium, group_idx=group)


def batch(*events: Any, rank: int | None = 0) -> KVEventBatch:
    return KVEventBatch(ts=time.time(), events=list(events), data_parallel_rank=rank)


class FakeEngine:
    """An XPUB + replay ROUTER pair driven by the test (asyncio sockets, this loop)."""

    def __init__(
        self,
        *,
        topic: str = "",
        buffer: int = 10_000,
        replay: bool = True,
        endpoint: str = "tcp://127.0.0.1:*",
        replay_topic: bool = True,
    ) -> None:
        self.ctx = zmq.asyncio.Context()
        # False: replay answers without the topic frame, as SGLang up to 0.5.21 sends them.
        self.replay_topic = replay_topic
        self.topic = topic.encode()
        self.buffer_max = buffer
        self.buffer: list[tuple[int, bytes]] = []
        self.next_seq = 0
        self.replay_requests: list[int] = []
        # While set and not yet set *on*, replay answers wait for it (a slow publisher).
        self.replay_gate: asyncio.Event | None = None
        self.subscriptions = 0
        self.pub = self.ctx.socket(zmq.XPUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.pub.setsockopt(zmq.XPUB_VERBOSE, 1)
        try:
            self.pub.bind(endpoint)
        except zmq.ZMQError:
            self.ctx.destroy(linger=0)
            raise
        self.endpoint = self.pub.getsockopt_string(zmq.LAST_ENDPOINT)
        self.router: zmq.asyncio.Socket | None = None
        self.replay_endpoint: str | None = None
        if replay:
            self.router = self.ctx.socket(zmq.ROUTER)
            self.router.setsockopt(zmq.LINGER, 0)
            self.router.bind("tcp://127.0.0.1:*")
            self.replay_endpoint = self.router.getsockopt_string(zmq.LAST_ENDPOINT)
        self._tasks = [asyncio.create_task(self._watch_subs())]
        if self.router is not None:
            self._tasks.append(asyncio.create_task(self._serve_replay()))

    def spec(self, worker_id: str, **extra: Any) -> dict[str, Any]:
        body = {"worker_id": worker_id, "endpoint": self.endpoint, **extra}
        if self.replay_endpoint is not None:
            body["replay_endpoint"] = self.replay_endpoint
        if self.topic:
            body.setdefault("topic", self.topic.decode())
        return body

    async def wait_subscribed(self, n: int = 1) -> None:
        await wait_until(lambda: self.subscriptions >= n, what="router's SUB subscription")

    async def _watch_subs(self) -> None:
        while True:
            msg = await self.pub.recv()
            if msg[:1] == b"\x01":
                self.subscriptions += 1

    async def _serve_replay(self) -> None:
        assert self.router is not None
        while True:
            ident, _, start = await self.router.recv_multipart()
            seq0 = int.from_bytes(start, "big")
            self.replay_requests.append(seq0)
            if self.replay_gate is not None:
                await self.replay_gate.wait()
            head = [self.topic] if self.replay_topic else []
            for seq, payload in self.buffer:
                if seq >= seq0:
                    await self.router.send_multipart(
                        [ident, b"", *head, seq.to_bytes(8, "big"), payload]
                    )
            end = [b""] if self.replay_topic else []
            await self.router.send_multipart([ident, b"", *end, REPLAY_END_SEQ, b""])

    async def publish(self, b: KVEventBatch, *, deliver: bool = True) -> int:
        """Buffer ``b`` under the next seq; send it live unless ``deliver`` is False."""
        return await self.publish_payload(encode_batch(b), deliver=deliver)

    async def publish_payload(self, payload: bytes, *, deliver: bool = True) -> int:
        seq = self.next_seq
        self.next_seq += 1
        self.buffer.append((seq, payload))
        del self.buffer[: max(0, len(self.buffer) - self.buffer_max)]
        if deliver:
            await self.pub.send_multipart([self.topic, seq.to_bytes(8, "big"), payload])
        return seq

    async def send_raw(self, frames: list[bytes]) -> None:
        await self.pub.send_multipart(frames)

    def restart_seq(self) -> None:
        """What a restarted publisher looks like on the wire: seq from 0, empty buffer."""
        self.next_seq = 0
        self.buffer.clear()

    async def close(self) -> None:
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        self.ctx.destroy(linger=0)


async def worker(client: httpx.AsyncClient, worker_id: str) -> dict[str, Any]:
    r = await client.get(f"/v1/workers/{worker_id}")
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


async def wait_seq(
    client: httpx.AsyncClient, worker_id: str, seq: int, rank: int = 0
) -> dict[str, Any]:
    """Wait until the router applied ``seq`` of ``rank`` for the worker; return its info."""

    async def done() -> dict[str, Any] | None:
        info = await worker(client, worker_id)
        return info if info["last_seq"].get(str(rank), -1) >= seq else None

    return await wait_until(done, what=f"{worker_id} rank {rank} seq {seq}")  # type: ignore[no-any-return]


async def sse_events(response: httpx.Response) -> AsyncIterator[tuple[str, int | None, Any]]:
    """Parse an SSE body into (event, id, JSON data)."""
    event, msg_id, data = "message", None, []
    async for line in response.aiter_lines():
        if not line:
            if data:
                yield event, msg_id, json.loads("\n".join(data))
            event, msg_id, data = "message", None, []
        elif line.startswith(":"):
            continue
        else:
            name, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if name == "event":
                event = value
            elif name == "id":
                msg_id = int(value)
            elif name == "data":
                data.append(value)


async def read_n(
    client: httpx.AsyncClient, n: int, path: str = "/s", headers: dict[str, str] | None = None
) -> list[tuple[int, Any]]:
    out = []
    async with client.stream("GET", path, headers=headers) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        async for event, msg_id, data in sse_events(r):
            assert event == "summary" and msg_id is not None
            out.append((msg_id, data))
            if len(out) == n:
                break
    return out


def chain(i: int) -> tuple[list[int], list[int]]:
    """Chain ``i``: two blocks of 4 tokens with made-up engine hashes (canonical mode)."""
    return [i * 10 + 1, i * 10 + 2], [i * 1000 + k for k in range(8)]


def store_chain(i: int) -> BlockStored:
    hashes, tokens = chain(i)
    return stored(hashes, tokens, block_size=4)


async def hits(svc: Any, worker_id: str, i: int) -> int:
    """Tokens of chain ``i`` the worker holds (0, or 8 when both blocks are indexed)."""
    resp = await svc.score([*chain(i)[1], 7], [worker_id])
    return int(resp.workers[0].hit_tokens)


async def subscribe(
    svc: Any, engine: FakeEngine, worker_id: str = "w0", *, synced: bool = False
) -> Any:
    """Register ``engine`` with ``svc`` as ``worker_id`` and wait until its SUB is
    subscribed (``synced``: and its catch-up replay has run); the subscription."""
    from router.config import WorkerSpec

    await svc.add_worker(WorkerSpec(**engine.spec(worker_id)))
    await engine.wait_subscribed()
    sub = svc.subscriptions.get(worker_id)
    assert sub is not None
    if synced:
        await wait_until(lambda: engine.replay_requests and not sub.syncing, what="caught up")
    return sub


async def start_subscribed(engine: FakeEngine, **settings: Any) -> tuple[Any, Any]:
    """A started ``RouterService`` (replay timeout 1 s, ``settings`` on top) with
    ``engine`` registered as ``w0`` and caught up; (service, subscription)."""
    from router.config import RouterSettings
    from router.service import RouterService

    svc = RouterService(RouterSettings(**{"replay_timeout_s": 1.0, **settings}))
    await svc.start()
    return svc, await subscribe(svc, engine, synced=True)
