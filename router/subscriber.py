"""Per-worker ZMQ subscriptions: live frames, sequence tracking, replay and resync.

One ``WorkerSubscription`` per registered worker owns an asyncio SUB socket (topic
prefix filter), a socket monitor for the connection state, and one task that applies
batches through the ``Ingestor`` strictly in order, exactly once per (DP rank, seq):

* the next expected seq -> apply;
* a gap -> replay from the first missing seq (``router.replay``); live frames wait in the
  SUB socket's queue (bounded by ``sub_hwm``) while the replay runs, and everything is
  deduplicated by seq afterwards;
* the replay starts after the missing seq (gap older than the publisher's buffer), fails,
  or there is no replay endpoint, or the seq goes backwards (the publisher restarted and
  counts from 0 again) -> clear the worker's entries and rebuild from what follows.

* a (re)connect -> a catch-up replay shortly after, which also notices a publisher that
  restarted while we were away (its history no longer matches our last batch).

Sequencing decisions live in ``router.sequencing`` (pure), index writes in
``router.index_writer`` (staged, merged, retried through outages). Bad frames are counted
and logged rate-limited (``router.ratelimited_log``). Nothing here raises out of the task.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import zlib
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING

import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from router.config import RouterSettings, WorkerSpec
from router.index_writer import IndexWriter
from router.logging_setup import event_extra
from router.netutil import (
    InvalidEndpoint,
    bind_endpoint,
    close_monitored,
    connect_endpoint,
    open_monitor,
)
from router.ratelimited_log import RateLimitedLog
from router.replay import ReplayFailed, ReplayFrame, ReplayTooLarge, request_replay
from router.sequencing import SeqTracker, Verdict
from schemas import AllBlocksCleared, DecodeError, DecodeStats, KVEventBatch, decode_batch

if TYPE_CHECKING:
    from router.ingest import Ingestor

log = logging.getLogger(__name__)

# Live frames handled per wake-up before yielding to the event loop (API fairness).
_DRAIN_PER_TURN = 512
# Longest idle wait on the SUB socket before checking for a due catch-up.
_IDLE_POLL_MS = 250
# Delay from a TCP connect to the catch-up replay: by then the subscription has reached
# the publisher, so nothing published after the replay's answer can be missed.
CATCH_UP_DELAY_S = 0.15
# Backoff of the clear-and-replay repair after a failed index write (doubles per failure).
_REPAIR_FIRST_S = 0.2
_REPAIR_MAX_S = 30.0
# Back-off between restarts of a failed subscription task.
_RESTART_MIN_S = 0.1
_RESTART_MAX_S = 5.0


@dataclass
class WorkerCounters:
    """Plain ints, read by the metrics collector and ``/v1/workers``."""

    batches: int = 0
    events: int = 0
    gaps: int = 0
    replays: int = 0
    replay_failures: int = 0
    resyncs: int = 0
    decode_errors: int = 0
    duplicates: int = 0
    ingest_retries: int = 0
    ingest_errors: int = 0
    tail_checks: int = 0  # idle-time replay asks for frames lost at the tail
    replay_overflows: int = 0
    task_restarts: int = 0

    def as_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


class WorkerSubscription:
    """The SUB socket, replay client and apply loop of one worker."""

    def __init__(
        self,
        spec: WorkerSpec,
        ctx: zmq.asyncio.Context,
        ingestor: Ingestor,
        settings: RouterSettings,
    ) -> None:
        self.spec = spec
        self.worker_id = spec.worker_id
        self.counters = WorkerCounters()
        self.decode_stats = DecodeStats()
        self.connected = False
        self.ever_connected = False
        self.syncing = False
        self._ctx = ctx
        self._settings = settings
        self._seq = SeqTracker()
        self._writer = IndexWriter(spec.worker_id, ingestor, settings, self.counters)
        self._catch_up_at: float | None = None
        self._registered_at = time.monotonic()
        self._last_frame_at = self._tail_checked_at = time.monotonic()
        self._repair_at: float | None = None
        self._repair_delay = _REPAIR_FIRST_S
        self.faulted = False  # an index write failed; repaired when _repair_at is due
        # Rebuilt from a replay buffer that did not reach back to seq 0: the index lacks
        # blocks cached before it, so estimates are lower bounds until the engine clears.
        self.partial_history = False
        self._resync_why: str | None = None
        self._stopping = False
        self._silent_logged = False
        self._tasks: list[asyncio.Task[None]] = []
        # Repeating faults (bad frames, failed replays): the first few, then one a minute.
        self._limited = RateLimitedLog(log)
        self._open_sockets(spec, ctx, settings)

    def _open_sockets(
        self, spec: WorkerSpec, ctx: zmq.asyncio.Context, settings: RouterSettings
    ) -> None:
        """The SUB (connected, or bound with ``bind``), its monitor and a blocking twin;
        raises ``InvalidEndpoint`` (or ``ZMQError`` when the context is out of sockets)
        without leaking what it opened."""
        sub: zmq.asyncio.Socket | None = None
        monitor: zmq.asyncio.Socket | None = None
        try:
            sub = ctx.socket(zmq.SUB)
            sub.setsockopt(zmq.LINGER, 0)
            sub.setsockopt(zmq.RCVHWM, settings.sub_hwm)
            sub.setsockopt(zmq.RECONNECT_IVL, 100)
            sub.setsockopt(zmq.RECONNECT_IVL_MAX, 2000)
            sub.setsockopt(zmq.SUBSCRIBE, spec.topic.encode())
            monitor = open_monitor(ctx, sub)
            if spec.bind:
                bind_endpoint(sub, spec.endpoint)
            else:
                connect_endpoint(sub, spec.endpoint)
            if spec.replay_endpoint is not None:
                probe = ctx.socket(zmq.DEALER)
                try:
                    connect_endpoint(probe, spec.replay_endpoint)
                finally:
                    probe.close(linger=0)
        except (InvalidEndpoint, zmq.ZMQError):
            close_monitored(sub, monitor)
            raise
        self._sub, self._monitor = sub, monitor
        # A blocking twin of the same socket: draining a backlog without one future per
        # frame is several times faster, and both see one queue.
        self._shadow = zmq.Socket.shadow(self._sub.underlying)

    # ------------------------------------------------------------------ lifecycle
    def _event(self, event: str, **fields: object) -> dict[str, object]:
        return event_extra(event, worker=self.worker_id, **fields)

    @property
    def state(self) -> str:
        if self.syncing:
            return "resyncing"
        if self.connected:
            return "connected"
        return "disconnected" if self.ever_connected else "connecting"

    @property
    def last_seq(self) -> dict[int, int]:
        """Per DP rank, the last seq whose batch the index has taken."""
        return dict(self._writer.written)

    @property
    def silent(self) -> bool:
        """No batch yet, ``silent_after_s`` after registration."""
        if self.counters.batches or self.counters.decode_errors:
            return False
        return time.monotonic() - self._registered_at >= self._settings.silent_after_s

    def _check_silent(self) -> None:
        if self._silent_logged or not self.silent:
            return
        self._silent_logged = True
        ep = self.spec.endpoint
        if self.spec.bind:
            hint = "is the engine's endpoint pointed at this router?"
        elif ep.startswith("tcp://") and not ep.startswith(("tcp://*", "tcp://[::]")):
            hint = (
                "is the engine up? If it was given this tcp://host:port too, it connects "
                "(vLLM binds only for * / :: / ipc): register with bind=true"
            )
        else:
            hint = "is the engine up and publishing there?"
        log.warning(
            "worker %s: no events %.0f s after registration (state %s, endpoint %s, topic %r); %s",
            self.worker_id,
            self._settings.silent_after_s,
            self.state,
            self.spec.endpoint,
            self.spec.topic,
            hint,
            extra=self._event("worker_silent", endpoint=self.spec.endpoint),
        )

    def lag_seconds(self) -> float:
        """How long the batch being applied has waited for the index (0 when none)."""
        return self._writer.retry.lag_seconds()

    def start(self) -> None:
        name = self.worker_id
        self._tasks = [
            asyncio.create_task(self._supervise(), name=f"kvroute-sub-{name}"),
            asyncio.create_task(self._watch_monitor(), name=f"kvroute-mon-{name}"),
        ]

    async def stop(self) -> None:
        self._stopping = True
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks = []
        self._close_sockets()

    def _close_sockets(self) -> None:
        close_monitored(self._sub, self._monitor)

    async def _watch_monitor(self) -> None:
        while True:
            msg = await self._monitor.recv_multipart()
            event = parse_monitor_message(msg)["event"]
            if event in (zmq.EVENT_CONNECTED, zmq.EVENT_ACCEPTED):
                self.connected = self.ever_connected = True
                log.info(
                    "worker %s connected (%s)",
                    self.worker_id,
                    self.spec.endpoint,
                    extra=self._event("worker_connected", endpoint=self.spec.endpoint),
                )
                if self.spec.replay_endpoint is not None and self._settings.replay_on_connect:
                    self._catch_up_at = time.monotonic() + CATCH_UP_DELAY_S
            elif event == zmq.EVENT_DISCONNECTED:
                self.connected = False
                log.info(
                    "worker %s disconnected; ZMQ reconnects",
                    self.worker_id,
                    extra=self._event("worker_disconnected"),
                )
            elif event == zmq.EVENT_MONITOR_STOPPED:
                return

    # ------------------------------------------------------------------ main loop
    async def _resume_from_index(self) -> None:
        """Before anything else: a router restarted on a shared index (Redis) resumes
        where the index says it was -- per rank the last applied seq and its payload's
        fingerprint -- so the catch-up replay applies only what is new and notices a
        publisher that restarted meanwhile. Entries without recorded seqs cannot be
        matched with the stream: they are cleared and rebuilt."""
        persisted = await self._writer.persisted_seqs()
        if persisted:
            for rank, (seq, fingerprint) in persisted.items():
                self._seq.mark_applied(rank, seq, fingerprint)
                self._writer.written[rank] = seq
        elif await self._writer.holds_entries():
            await self._clear("the index holds this worker's entries without their seqs")

    def request_resync(self, why: str) -> None:
        """Clear and rebuild from the publisher's buffer, in this subscription's task."""
        self._resync_why = why

    async def _supervise(self) -> None:
        """Run the apply loop; an unexpected exception restarts it (counted in
        ``task_restarts``, logged rate-limited) instead of leaving the worker frozen at
        its last seq while shown as connected. The restart asks for a catch-up replay."""
        delay = _RESTART_MIN_S
        while True:
            try:
                await self._run()
                return  # the SUB socket was closed: the subscription is stopping
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.counters.task_restarts += 1
                self._limited.exception(
                    "task_failed",
                    "worker %s: subscription task failed (%s); restarting in %.2fs",
                    self.worker_id,
                    exc,
                    delay,
                    extra=self._event("subscription_restarted", error=type(exc).__name__),
                )
                self.syncing = False
                await asyncio.sleep(delay)
                delay = min(delay * 2, _RESTART_MAX_S)
                if self.spec.replay_endpoint is not None:
                    self._catch_up_at = time.monotonic()

    async def _run(self) -> None:
        await self._resume_from_index()
        while not self._stopping:
            if self._resync_why is not None:
                why, self._resync_why = self._resync_why, None
                self._seq.forget_live()
                if self.spec.replay_endpoint is not None:
                    await self._recover(start=0, clear_first=True, why=why)
                else:
                    await self._clear(why)
                    self.partial_history = True
            if self._repair_at is not None and time.monotonic() >= self._repair_at:
                await self._repair()
            due = self._catch_up_at
            if due is not None and time.monotonic() >= due:
                self._catch_up_at = None
                await self._catch_up()
            wait_ms = _IDLE_POLL_MS if due is None else max(1, int((due - time.monotonic()) * 1e3))
            try:
                if not await self._sub.poll(min(wait_ms, _IDLE_POLL_MS)):
                    self._check_silent()
                    await self._check_tail()
                    continue
            except zmq.ZMQError as exc:  # socket closed under us: stop quietly
                log.debug("worker %s SUB socket error: %s", self.worker_id, exc)
                return
            self._last_frame_at = time.monotonic()
            for _ in range(_DRAIN_PER_TURN):
                try:
                    frames = self._shadow.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                await self._on_live(frames)
            await self._flush()
            await asyncio.sleep(0)

    async def _check_tail(self) -> None:
        """PUB/SUB has no heartbeat: a frame lost at the end of a burst stays unnoticed
        until the next frame arrives. After ``tail_check_s`` of silence, ask the replay
        socket for anything after our last seq (an idle engine answers with nothing)."""
        every = self._settings.tail_check_s
        top = self._seq.top_seq
        if not every or top is None or self.spec.replay_endpoint is None:
            return
        now = time.monotonic()
        if now - max(self._last_frame_at, self._tail_checked_at) < every:
            return
        self._tail_checked_at = now
        self.counters.tail_checks += 1
        frames = await self._fetch_replay(top + 1, quiet=True)
        if frames:
            self.counters.gaps += 1
            log.warning(
                "worker %s: %d frame(s) after seq %d were lost at the tail of the stream; replayed",
                self.worker_id,
                len(frames),
                top,
                extra=self._event("lost_tail", seq=top, frames=len(frames)),
            )
            await self._apply_replayed(frames)
            await self._flush()

    async def _catch_up(self) -> None:
        """After a (re)connect: fetch what was published while we were not subscribed,
        and tell a publisher that carried on from one that restarted meanwhile.

        The replay starts at our newest applied seq so its first frame can be compared
        with what we applied: a publisher that carried on answers that very frame; a
        restarted one answers nothing, other bytes, or (if it got further) a later seq.
        """
        seq = self._seq
        top, fingerprint = seq.top_seq, seq.top_print
        if top is None or not seq.shared:  # nothing to compare with: plain catch-up
            await self._recover(start=0 if top is None else top, quiet=True)
            return
        got = await self._fetch_replay(top, quiet=True)
        if got is None:
            return
        same = bool(got) and got[0].seq == top and zlib.crc32(got[0].payload) == fingerprint
        if same:
            await self._apply_replayed(got)
            await self._flush()
            return
        if got and got[0].seq > top:
            # Its buffer starts after our last seq: it moved past its buffer while we
            # were away (or restarted and got further); either way history is missing.
            why, event = f"the publisher's buffer now starts at seq {got[0].seq}", "replay_overrun"
        else:  # nothing at our seq, or other bytes there: a new publisher process
            why, event = "the publisher restarted while we were away", "publisher_restarted"
        log.warning(
            "worker %s: history after seq %d is not available (%s); resyncing",
            self.worker_id,
            top,
            why,
            extra=self._event(event, seq=top),
        )
        self._seq.forget_live()
        await self._recover(start=0, clear_first=True, why=why)

    async def _on_live(self, frames: list[bytes]) -> None:
        if len(frames) != 3 or len(frames[1]) != 8:
            self._decode_error(f"expected 3 frames [topic, seq(8B), payload], got {len(frames)}")
            return
        seq = int.from_bytes(frames[1], "big")
        scratch = DecodeStats()  # counted unless a replay already applied this frame
        batch = self._decode(frames[2], seq, scratch)
        if batch is None:
            if self.spec.replay_endpoint is not None:
                # Corrupted in transit? The publisher's buffer holds its own copy: fetch
                # from this seq (a copy that is bad there too stays skipped, counted).
                await self._recover(start=seq, quiet=True)
            return
        rank = batch.data_parallel_rank or 0
        decision = self._seq.observe_live(rank, seq)
        verdict = decision.verdict
        if verdict is not Verdict.DUPLICATE:
            self.decode_stats.add(scratch)
        if verdict is Verdict.APPLY:
            await self._apply(seq, batch, frames[2])
        elif verdict is Verdict.DUPLICATE:
            self.counters.duplicates += 1  # already applied from a replay
        elif verdict is Verdict.RESTART:
            log.warning(
                "worker %s rank %d: seq went back to %d (publisher restarted); resyncing",
                self.worker_id,
                rank,
                seq,
                extra=self._event("publisher_restarted", rank=rank, seq=seq),
            )
            await self._resync_from(seq, batch, frames[2])
        elif verdict is Verdict.JOIN:
            if self.spec.replay_endpoint is not None:
                # Joined mid-stream: fetch the history still buffered, keep nothing old.
                await self._recover(start=0)
            await self._apply_if_new(seq, batch, frames[2])
        else:
            self.counters.gaps += 1
            log.warning(
                "worker %s rank %d: gap %d..%d",
                self.worker_id,
                rank,
                decision.start,
                seq - 1,
                extra=self._event("gap", rank=rank, first_missing=decision.start, seq=seq),
            )
            if self.spec.replay_endpoint is None:
                await self._clear("gap and no replay endpoint")
                self.partial_history = True
            else:
                await self._recover(start=decision.start, clear_on_miss=True)
            await self._apply_if_new(seq, batch, frames[2])

    async def _resync_from(self, seq: int, batch: KVEventBatch, payload: bytes) -> None:
        if seq > 0 and self.spec.replay_endpoint is not None:
            await self._recover(start=0, clear_first=True)
        else:
            await self._clear("publisher restarted")
        await self._apply_if_new(seq, batch, payload)

    # ------------------------------------------------------------------ recovery
    async def _recover(
        self,
        *,
        start: int,
        clear_on_miss: bool = False,
        clear_first: bool = False,
        quiet: bool = False,
        why: str = "publisher restarted",
    ) -> None:
        """Replay from ``start`` and apply what it returns exactly once.

        ``clear_on_miss``: the replay must begin at ``start`` or the stream has a hole we
        cannot fill, so the worker is cleared and rebuilt from the buffer instead.
        """
        self.syncing = not quiet  # a catch-up after connecting is not a resync
        try:
            if clear_first:
                await self._clear(why)
            frames = await self._fetch_replay(start, quiet=quiet) or []
            if clear_on_miss and (not frames or frames[0].seq > start):
                first = frames[0].seq if frames else None
                await self._clear(f"replay cannot fill from {start} (buffer starts at {first})")
                clear_first = True
            if clear_first:
                # Rebuilt from the buffer: complete only if it reaches back to seq 0.
                self.partial_history = bool(frames) and frames[0].seq > 0
            await self._apply_replayed(frames)
            await self._flush()
        finally:
            self.syncing = False

    async def _fetch_replay(self, start: int, *, quiet: bool) -> list[ReplayFrame] | None:
        """The publisher's buffered frames from ``start`` on our topic; None on failure."""
        assert self.spec.replay_endpoint is not None
        self.counters.replays += 1
        try:
            frames, malformed = await request_replay(
                self._ctx,
                self.spec.replay_endpoint,
                start,
                timeout_s=self._settings.replay_timeout_s,
                max_frames=self._settings.replay_max_frames,
                max_bytes=self._settings.replay_max_bytes,
            )
        except ReplayFailed as exc:
            self.counters.replay_failures += 1
            if isinstance(exc, ReplayTooLarge):
                self.counters.replay_overflows += 1
            # Right after connecting the ROUTER may simply not be up yet: no warning.
            self._limited.log(
                logging.INFO if quiet else logging.WARNING,
                "replay_failed",
                "worker %s: %s",
                self.worker_id,
                exc,
                extra=self._event("replay_failed", start=start),
            )
            return None
        self.counters.decode_errors += malformed
        prefix = self.spec.topic.encode()
        return [f for f in frames if f.topic.startswith(prefix)]

    async def _apply_replayed(self, frames: list[ReplayFrame]) -> None:
        """Apply the frames not applied yet; a replay overlaps what was decoded live, so
        decoder counters count a frame only when it is new (once per seq)."""
        for frame in frames:
            scratch = DecodeStats()
            batch = self._decode(frame.payload, frame.seq, scratch)
            if batch is None:
                continue
            if self._seq.is_new(batch.data_parallel_rank or 0, frame.seq):
                self.decode_stats.add(scratch)
            await self._apply_if_new(frame.seq, batch, frame.payload)

    async def _clear(self, why: str) -> None:
        log.warning(
            "worker %s: clearing its index entries and rebuilding (%s)",
            self.worker_id,
            why,
            extra=self._event("resync", reason=why),
        )
        self.counters.resyncs += 1
        self._seq.forget_applied()
        await self._writer.clear()

    async def _flush(self) -> None:
        """Write what is staged. A write that failed (not an outage: a bug, a bad
        backend reply) leaves the index without those batches: the worker is marked
        ``faulted`` and repaired -- cleared and rebuilt from the publisher's buffer --
        after a backoff that doubles while repairs fail, so a fault that persists costs
        a repair every ``_REPAIR_MAX_S`` at most, never a hot loop."""
        await self._writer.flush()
        if self._writer.failed:
            self._writer.failed = False
            self._fault()

    def _fault(self) -> None:
        self.faulted = True
        if self._repair_at is None:
            self._repair_at = time.monotonic() + self._repair_delay
            self._repair_delay = min(self._repair_delay * 2, _REPAIR_MAX_S)

    async def _repair(self) -> None:
        self._repair_at = None
        await self._clear("an index write failed")
        if self.spec.replay_endpoint is not None:
            await self._apply_replayed(await self._fetch_replay(0, quiet=False) or [])
        await self._writer.flush()
        if self._writer.failed or self._writer.clear_failed:
            self._writer.failed = self._writer.clear_failed = False
            self._fault()
            return
        self.faulted = False
        self._repair_delay = _REPAIR_FIRST_S
        log.info(
            "worker %s: repaired after a failed index write",
            self.worker_id,
            extra=self._event("worker_repaired"),
        )

    # ------------------------------------------------------------------ apply
    async def _apply_if_new(self, seq: int, batch: KVEventBatch, payload: bytes) -> None:
        if not self._seq.is_new(batch.data_parallel_rank or 0, seq):
            self.counters.duplicates += 1
            return
        await self._apply(seq, batch, payload)

    async def _apply(self, seq: int, batch: KVEventBatch, payload: bytes) -> None:
        """Count ``batch`` as applied (sequencing) and stage it for the index."""
        rank = batch.data_parallel_rank or 0
        if self.partial_history and any(isinstance(e, AllBlocksCleared) for e in batch.events):
            self.partial_history = False  # the engine started over: nothing is missing
        fingerprint = zlib.crc32(payload)
        self._seq.mark_applied(rank, seq, fingerprint)
        await self._writer.stage(rank, seq, batch, fingerprint)

    # ------------------------------------------------------------------ decode
    def _decode(
        self, payload: bytes, seq: int, stats: DecodeStats | None = None
    ) -> KVEventBatch | None:
        try:
            return decode_batch(payload, self.decode_stats if stats is None else stats)
        except DecodeError as exc:
            if self._seq.is_bad(seq):  # bad at the source too: its replayed copy
                return None
            self._seq.mark_bad(seq)
            self._decode_error(f"seq {seq}: {exc}")
            return None

    def _decode_error(self, why: str) -> None:
        self.counters.decode_errors += 1
        self._limited.warning(
            "decode_error",
            "worker %s: undecodable frame skipped (%s); %d so far",
            self.worker_id,
            why,
            self.counters.decode_errors,
            extra=self._event("decode_error"),
        )
