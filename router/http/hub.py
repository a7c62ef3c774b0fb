"""``StreamHub``: fan one periodic summary out to many Server-Sent-Events clients.

Why a hub: a dashboard summary walks every worker and group (and, with Redis, asks the
index), so it is computed once per tick, encoded once, and the same bytes are queued to
every client. Each client has a small bounded queue; a client that falls that far behind
(a stalled tab, a slow link) is dropped, never buffered without bound, and its
``EventSource`` reconnects by itself. Nothing is computed while nobody listens: the
ticker starts with the first client and stops a tick after the last one leaves.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

import msgspec

from router.ratelimited_log import RateLimitedLog
from router.service import UnknownWorker

if TYPE_CHECKING:
    from router.service import RouterService

log = logging.getLogger(__name__)

SummaryFn = Callable[[], Awaitable[dict[str, Any]] | dict[str, Any]]

_json = msgspec.json.Encoder()


def sse_message(event: str, data: Any, msg_id: int | None = None) -> bytes:
    """One SSE message; ``data`` is JSON-encoded on one line (JSON never holds a raw LF)."""
    head = f"id: {msg_id}\n" if msg_id is not None else ""
    return f"{head}event: {event}\ndata: ".encode() + _json.encode(data) + b"\n\n"


class Subscriber:
    """One client's bounded queue; ``None`` in the queue ends the stream."""

    def __init__(self, queue_size: int) -> None:
        self.queue: asyncio.Queue[bytes | None] = asyncio.Queue(maxsize=queue_size)
        self.dropped = False
        self.closed = False

    def offer(self, message: bytes) -> bool:
        """Queue ``message``; False if the client is too far behind (caller drops it)."""
        try:
            self.queue.put_nowait(message)
        except asyncio.QueueFull:
            return False
        return True

    def end(self) -> None:
        """Discard what is queued and wake the reader with the end marker."""
        self.closed = True
        while True:
            try:
                self.queue.get_nowait()
            except asyncio.QueueEmpty:
                break
        self.queue.put_nowait(None)

    async def messages(self) -> AsyncIterator[bytes]:
        while True:
            message = await self.queue.get()
            if message is None:
                return
            yield message


class TooManyClients(Exception):
    """The hub already serves ``max_clients`` streams (the endpoint answers 503)."""


class StreamHub:
    """Compute ``summary()`` once per ``period_s`` while clients listen; fan it out."""

    def __init__(
        self,
        summary: SummaryFn,
        *,
        period_s: float = 1.0,
        queue_size: int = 8,
        max_clients: int = 256,
        event: str = "summary",
    ) -> None:
        if period_s <= 0 or queue_size < 1:
            raise ValueError("period_s must be > 0 and queue_size >= 1")
        self._summary = summary
        self.period_s = period_s
        self.queue_size = queue_size
        self.max_clients = max_clients
        self.event = event
        self._subs: set[Subscriber] = set()
        self.loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._closed = False
        self._last: bytes | None = None
        self._last_at = 0.0
        self.ticks = 0
        self.computations = 0
        self.dropped = 0
        self.refused = 0  # subscriptions refused at max_clients (answered 503)
        self.errors = 0
        self._limited = RateLimitedLog(log)  # per hub: repeating failures, with counts

    @property
    def clients(self) -> int:
        return len(self._subs)

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def subscribe(self) -> Subscriber:
        """Register a client; it gets the latest summary at once when there is a fresh one."""
        if self._closed:
            raise TooManyClients("the stream is shutting down")
        if len(self._subs) >= self.max_clients:
            self.refused += 1
            self._limited.warning(
                "refused",
                "stream client refused: %d clients connected (%d refused so far)",
                self.max_clients,
                self.refused,
                extra={"event": "stream_client_refused"},
            )
            raise TooManyClients(f"{self.max_clients} stream clients already connected")
        self.loop = asyncio.get_running_loop()
        sub = Subscriber(self.queue_size)
        self._subs.add(sub)
        fresh = self._last is not None and time.monotonic() - self._last_at < 2 * self.period_s
        if fresh:
            assert self._last is not None
            sub.offer(self._last)
        else:
            self._wake.set()  # compute now rather than leave a new dashboard blank
        if not self.running:
            self._task = asyncio.create_task(self._run(), name="kvroute-stream-hub")
        return sub

    def unsubscribe(self, sub: Subscriber) -> None:
        self._subs.discard(sub)
        sub.closed = True

    async def stream(self, sub: Subscriber) -> AsyncIterator[bytes]:
        """The SSE body for one client: a reconnect hint, then messages until dropped/closed."""
        try:
            yield f"retry: {max(1000, int(self.period_s * 2000))}\n\n".encode()
            async for message in sub.messages():
                yield message
        finally:
            self.unsubscribe(sub)

    async def close(self) -> None:
        """End every client's stream and stop the ticker (server shutdown)."""
        self._closed = True
        for sub in list(self._subs):
            sub.end()
        self._subs.clear()
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _compute(self) -> bytes | None:
        self.computations += 1
        try:
            result = self._summary()
            data = await result if inspect.isawaitable(result) else result
        except Exception as exc:  # a failing summary must not kill the stream
            self.errors += 1
            # A summary failing every tick stays visible, at most once a minute.
            self._limited.exception("summary", "stream summary failed: %s", exc)
            return None
        self.ticks += 1
        return sse_message(self.event, data, self.ticks)

    def _broadcast(self, message: bytes) -> None:
        for sub in list(self._subs):
            if not sub.offer(message):
                self._subs.discard(sub)
                sub.dropped = True
                sub.end()
                self.dropped += 1
                self._limited.warning(
                    "dropped",
                    "stream client dropped: %d messages behind (%d dropped so far)",
                    self.queue_size,
                    self.dropped,
                    extra={"event": "stream_client_dropped"},
                )

    async def _run(self) -> None:
        try:
            while self._subs and not self._closed:
                self._wake.clear()
                message = await self._compute()
                if message is not None:
                    self._last, self._last_at = message, time.monotonic()
                    self._broadcast(message)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), self.period_s)
        finally:
            if self._task is asyncio.current_task():
                self._task = None


class SummaryBuilder:
    """Builds the dashboard summary from a ``RouterService``; rates are per-second deltas
    against the previous call (one call per hub tick)."""

    def __init__(self, service: RouterService, *, routes: int = 20) -> None:
        self.service = service
        self.routes = routes
        self._prev_t: float | None = None
        self._prev: dict[str, float] = {}

    def _rate(self, key: str, value: float, dt: float | None) -> float:
        prev = self._prev.get(key)
        self._prev[key] = value
        if dt is None or prev is None or dt <= 0 or value < prev:
            return 0.0
        return round((value - prev) / dt, 2)

    async def build(self) -> dict[str, Any]:
        svc = self.service
        now = time.monotonic()
        dt = None if self._prev_t is None else now - self._prev_t
        self._prev_t = now
        workers: list[dict[str, Any]] = []
        fleet_blocks: dict[str, int] = {}
        fleet_groups: dict[str, dict[str, int]] = {}
        for worker_id in svc.worker_ids():
            try:
                info = await svc.worker_info(worker_id)
            except UnknownWorker:  # deleted while we walked the list
                continue
            blocks: dict[str, int] = {}
            groups = []
            for g, group in sorted(info.groups.items()):
                by_medium = dict(group.blocks_by_medium)
                groups.append(
                    {
                        "group_idx": g,
                        "kind": group.kind,
                        "block_size": group.block_size,
                        "sliding_window": group.sliding_window,
                        "blocks": by_medium,
                    }
                )
                fleet_group = fleet_groups.setdefault(str(g), {})
                for medium, n in by_medium.items():
                    blocks[medium] = blocks.get(medium, 0) + n
                    fleet_group[medium] = fleet_group.get(medium, 0) + n
            for medium, n in blocks.items():
                fleet_blocks[medium] = fleet_blocks.get(medium, 0) + n
            total = sum(blocks.values())
            workers.append(
                {
                    "worker_id": worker_id,
                    "state": info.state,
                    "endpoint": info.endpoint,
                    "hash_mode": info.hash_mode,
                    "last_seq": info.last_seq,
                    "events": info.events,
                    "event_rate": self._rate(f"events/{worker_id}", info.events, dt),
                    "gaps": info.gaps,
                    "replays": info.replays,
                    "resyncs": info.resyncs,
                    "decode_errors": info.decode_errors,
                    "replay_failures": info.replay_failures,
                    "ingest_lag_s": info.ingest_lag_s,
                    "blocks": blocks,
                    "blocks_total": total,
                    "block_rate": self._rate(f"blocks/{worker_id}", total, dt),
                    "groups": groups,
                }
            )
        counters = svc.ingestor.counters
        try:
            stats = await svc.index_stats()
            index: dict[str, Any] = {
                "kind": stats.get("kind", svc.index.kind),
                "up": True,
                "entries": stats.get("entries"),
                "bytes": stats.get("bytes"),
            }
        except Exception:  # IndexUnavailable, or a backend failing some other way
            index = {"kind": svc.index.kind, "up": False, "entries": None, "bytes": None}
        return {
            "ts": time.time(),
            "uptime_s": round(time.time() - svc.started_at, 1),
            "index": index,
            "workers": workers,
            "totals": {
                "workers": len(workers),
                "connected": sum(1 for w in workers if w["state"] == "connected"),
                "blocks": fleet_blocks,
                "groups": fleet_groups,
                "events": sum(w["events"] for w in workers),
                "event_rate": round(sum(w["event_rate"] for w in workers), 2),
                "store_rate": self._rate("stored", counters.blocks_stored, dt),
                "remove_rate": self._rate("removed", counters.blocks_removed, dt),
                "gaps": sum(w["gaps"] for w in workers),
                "replays": sum(w["replays"] for w in workers),
                "resyncs": sum(w["resyncs"] for w in workers),
                "decode_errors": sum(w["decode_errors"] for w in workers),
                "ingest_lag_s": max((w["ingest_lag_s"] for w in workers), default=0.0),
            },
            "errors": {
                "decode_errors": sum(w["decode_errors"] for w in workers),
                "replay_failures": sum(w["replay_failures"] for w in workers),
                "unknown_parent": counters.unknown_parent,
                "partial_unknown_prefix": counters.partial_unknown_prefix,
                "unresolved_blocks": counters.unresolved_blocks,
                "bad_events": counters.bad_events,
                "unknown_events": sum(
                    sub.decode_stats.unknown_event_types for sub in svc.subscriptions.all()
                ),
                "malformed_events": sum(
                    sub.decode_stats.malformed_events for sub in svc.subscriptions.all()
                ),
            },
            "routes": self._recent_routes(),
            # The OpenAI proxy's per-worker liveness and estimate accuracy (router/proxy).
            "proxy": proxy.counters.summary(proxy.health)
            if (proxy := getattr(svc, "proxy", None)) is not None
            else None,
        }

    def _recent_routes(self) -> list[dict[str, Any]]:
        recent = list(self.service.recent_routes)[-self.routes :]
        out = []
        for item in reversed(recent):  # newest first
            if isinstance(item, Mapping):
                out.append({k: item.get(k) for k in _ROUTE_FIELDS})
        return out


_ROUTE_FIELDS = ("ts", "request_id", "worker_id", "hit_tokens", "request_tokens", "policy")
