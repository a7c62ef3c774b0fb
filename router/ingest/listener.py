"""One bound SUB socket that every engine connects to, workers named by topic.

Why: vLLM connects its PUB for ``tcp://host:port`` endpoints (it binds only for ``*``,
``::``, ipc and inproc), and llm-d deploys exactly that way -- every vLLM pod connects to
one consumer's bound SUB and names itself in the topic ``kv@<pod-ip>@<model>``. With
``--listen tcp://*:5557`` the router accepts such a fleet without registering workers
one by one: the first frame of a new topic creates its worker (``kv@<id>`` works too),
and from then on each worker is sequenced and ingested like any other, only its frames
arrive through the shared socket instead of one of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import Awaitable, Callable

import zmq
import zmq.asyncio
from pydantic import ValidationError

from router.config import RouterSettings, WorkerSpec
from router.ingest.sub_socket import new_sub
from router.ingest.subscription import WorkerSubscription
from router.netutil import bind_endpoint
from router.ratelimited_log import RateLimitedLog

log = logging.getLogger(__name__)

_ID_OK = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:@-]{0,127}$")


def parse_topic(topic: bytes) -> tuple[str, str | None] | None:
    """``kv@<worker>[@<model>]`` -> (worker id, model), or None for anything else."""
    try:
        text = topic.decode()
    except UnicodeDecodeError:
        return None
    prefix, sep, rest = text.partition("@")
    if prefix != "kv" or not sep:
        return None
    worker, _, model = rest.partition("@")
    if not _ID_OK.match(worker):
        return None
    return worker, model or None


class FedSubscription(WorkerSubscription):
    """A worker whose frames the listener hands over: no socket, no loop of its own."""

    _resumed = False

    def _open_sockets(self, *args: object) -> None:
        return

    def start(self) -> None:
        return

    def _close_sockets(self) -> None:
        return

    async def feed(self, frames: list[bytes]) -> None:
        if self._stopping:  # removed while the listener held it: nothing more to the index
            return
        self.connected = self.ever_connected = True
        self._last_frame_at = time.monotonic()
        if not self._resumed:  # as a worker's own loop starts: from what a shared index kept
            self._resumed = True
            await self._resume()
        await self._maintain()  # as a worker's own loop does between frames
        await self._on_live(frames)
        await self._flush()  # not the writer's: a failed write marks it faulted, repaired


class TopicListener:
    """The shared SUB and its loop; ``register`` creates a worker for a new topic."""

    def __init__(
        self,
        settings: RouterSettings,
        ctx: zmq.asyncio.Context,
        lookup: Callable[[str], WorkerSubscription | None],
        register: Callable[[WorkerSpec], Awaitable[WorkerSubscription | None]],
    ) -> None:
        assert settings.listen is not None
        self.endpoint = settings.listen
        self.unknown_topics = 0
        self.dispatch_errors = 0
        self._lookup = lookup
        self._register = register
        self._sock = new_sub(ctx, settings)
        self._sock.setsockopt(zmq.SUBSCRIBE, b"kv@")
        bind_endpoint(self._sock, self.endpoint)
        self._limited = RateLimitedLog(log)  # keys bounded by RateLimitedLog.max_keys

    async def run(self) -> None:
        try:
            while True:
                frames = await self._sock.recv_multipart()
                try:
                    await self._dispatch(frames)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # one bad frame must not end every engine's feed
                    self.dispatch_errors += 1
                    self._limited.exception(
                        "dispatch_failed",
                        "listener: frame on topic %r failed (%s); %d so far",
                        frames[0][:64] if frames else b"",
                        exc,
                        self.dispatch_errors,
                    )
        finally:
            with contextlib.suppress(zmq.ZMQError):
                self._sock.close(linger=0)

    async def _dispatch(self, frames: list[bytes]) -> None:
        parsed = parse_topic(frames[0]) if frames else None
        if parsed is None:
            self._unusable(frames, "unusable topic")
            return
        worker_id, model = parsed
        sub = self._lookup(worker_id)
        if sub is None:
            try:
                spec = WorkerSpec(
                    worker_id=worker_id,
                    endpoint=self.endpoint,
                    topic=frames[0].decode(),
                    model=model,
                    via_listener=True,
                )
            except ValidationError:  # e.g. a model name too long for a worker's spec
                self._unusable(frames, "unusable topic (no valid worker spec)")
                return
            sub = await self._register(spec)
            if sub is None:
                self.unknown_topics += 1
                return
        if isinstance(sub, FedSubscription):
            await sub.feed(frames)
        else:  # registered with its own socket too: its own loop ingests it
            self._unusable(frames, f"topic names worker {worker_id}, which has its own socket")

    def _unusable(self, frames: list[bytes], why: str) -> None:
        self.unknown_topics += 1
        topic = frames[0][:64] if frames else b""
        self._limited.warning(
            ("topic", topic),
            "listener: frame with %s %r (%d so far)",
            why,
            topic,
            self.unknown_topics,
        )
