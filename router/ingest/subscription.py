"""Per-worker ZMQ subscriptions: live frames, sequence tracking, replay and resync.

One ``WorkerSubscription`` per registered worker owns an asyncio SUB socket (topic
prefix filter), a socket monitor for the connection state, and one task that applies
batches through the ``Ingestor`` strictly in order, exactly once per (DP rank, seq):

* the next expected seq -> apply;
* a gap -> replay from the first missing seq (``replay_client``); live frames wait in the
  SUB socket's queue (bounded by ``sub_hwm``) while the replay runs, and everything is
  deduplicated by seq afterwards;
* the replay starts after the missing seq (gap older than the publisher's buffer), fails,
  or there is no replay endpoint, or the seq goes backwards (the publisher restarted and
  counts from 0 again) -> clear the worker's entries and rebuild from what follows;
* a (re)connect -> a catch-up replay shortly after, which also notices a publisher that
  restarted while we were away (its history no longer matches our last batch).
* seqs that keep going back (two publishers under one topic) -> a conflict: cleared once,
  frames dropped until it stops (``router.ingest.conflicts``, ``router.ingest.live_verdicts``).

Sequencing decisions live in ``router.ingest.sequencing`` (pure), index writes in
``router.ingest.writer`` (staged, merged, retried through outages). Bad frames are counted
and logged rate-limited (``router.ratelimited_log``). Nothing here raises out of the task.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import zlib
from typing import TYPE_CHECKING

import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from router.config import RouterSettings, WorkerSpec
from router.ingest import packed
from router.ingest.conflicts import PublisherConflict
from router.ingest.counters import WorkerCounters
from router.ingest.gc_pause import gc_paused
from router.ingest.live_verdicts import LiveVerdictsMixin
from router.ingest.recovery import REPAIR_FIRST_S
from router.ingest.sequencing import MAX_RANKS, SeqTracker, Verdict
from router.ingest.sub_socket import REOPEN_AFTER_S, open_worker_sockets, reopen, silent_hint
from router.ingest.writer import IndexWriter
from router.logging_setup import event_extra
from router.netutil import close_monitored
from router.ratelimited_log import RateLimitedLog
from schemas import AllBlocksCleared, DecodeError, DecodeStats, KVEventBatch, decode_batch

if TYPE_CHECKING:
    from router.ingest.ingestor import Ingestor

log = logging.getLogger(__name__)

# Live frames handled per wake-up before yielding to the event loop (API fairness).
_DRAIN_PER_TURN = 512
# Longest idle wait on the SUB socket before checking for a due catch-up.
_IDLE_POLL_MS = 250
# Delay from a TCP connect to the catch-up replay: by then the subscription has reached
# the publisher, so nothing published after the replay's answer can be missed.
CATCH_UP_DELAY_S = 0.15
# Back-off between restarts of a failed subscription task.
_RESTART_MIN_S = 0.1
_RESTART_MAX_S = 5.0


class WorkerSubscription(LiveVerdictsMixin):
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
        self.connected = self.ever_connected = False
        self.syncing = False
        self._ctx = ctx
        self._settings = settings
        self._seq = SeqTracker()
        self._conflict = PublisherConflict()
        self._writer = IndexWriter(spec.worker_id, ingestor, settings, self.counters)
        self._catch_up_at: float | None = None
        self._registered_at = self._last_frame_at = self._tail_checked_at = time.monotonic()
        self._repair_at: float | None = None
        self._repair_delay = REPAIR_FIRST_S
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
        self._sub, self._monitor = open_worker_sockets(spec, ctx, settings)
        # A blocking twin of the same socket: draining a backlog without one future per
        # frame is several times faster, and both see one queue.
        self._shadow: zmq.Socket[bytes] = zmq.Socket.shadow(self._sub.underlying)

    # ------------------------------------------------------------------ lifecycle
    def _event(self, event: str, **fields: object) -> dict[str, object]:
        return event_extra(event, worker=self.worker_id, **fields)

    @property
    def state(self) -> str:
        if self.in_conflict:
            return "conflict"
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
        log.warning(
            "worker %s: no events %.0f s after registration (state %s, endpoint %s, topic %r); %s",
            self.worker_id,
            self._settings.silent_after_s,
            self.state,
            self.spec.endpoint,
            self.spec.topic,
            silent_hint(self.spec),
            extra=self._event("worker_silent", endpoint=self.spec.endpoint),
        )

    def lag_seconds(self) -> float:
        """How long the batch being applied has waited for the index, or the live frames
        for the replay that is running (0 when neither)."""
        lag, since = self._writer.retry.lag_seconds(), self._recovering_since
        return lag if since is None else max(lag, time.monotonic() - since)

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
        ended = False  # disconnected where we connect, and libzmq not retrying
        while True:
            # poll's own timeout, not asyncio.wait_for: cancelling a wait_for around the
            # monitor's recv at shutdown hung (tests/router/ingest/test_subscription.py)
            if ended and not await self._monitor.poll(int(REOPEN_AFTER_S * 1e3)):
                ended = False
                self._reopen()
                continue
            msg = await self._monitor.recv_multipart()
            event = parse_monitor_message(msg)["event"]
            ended = event == zmq.EVENT_DISCONNECTED and not self.spec.bind
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

    def _reopen(self) -> None:
        """libzmq ended our connection for good (a protocol error: a message over
        ``sub_max_message_bytes``, a malformed frame) and will not retry: connect again."""
        if reopen(self._sub, self.spec.endpoint):
            self.counters.reopened += 1
            self._reopened = True
            self._limited.warning(
                "reopened",
                "worker %s: ZMQ ended the connection for good (a message over "
                "sub_max_message_bytes, or a malformed frame); connecting again",
                self.worker_id,
                extra=self._event("connection_reopened"),
            )

    # ------------------------------------------------------------------ main loop
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

    async def _maintain(self) -> None:
        """Between frames: a resync asked for, and a failed write's repair once due."""
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

    async def _run(self) -> None:
        await self._resume()
        while not self._stopping:
            await self._maintain()
            due = self._catch_up_at
            if due is not None and time.monotonic() >= due:
                self._catch_up_at = None
                await self._catch_up()
            wait_ms = _IDLE_POLL_MS if due is None else max(1, int((due - time.monotonic()) * 1e3))
            try:
                if not await self._sub.poll(min(wait_ms, _IDLE_POLL_MS)):
                    self._check_silent()
                    await self._refetch_undecodable()
                    await self._check_tail()
                    self._check_deferred()
                    continue
            except zmq.ZMQError as exc:  # socket closed under us: stop quietly
                log.debug("worker %s SUB socket error: %s", self.worker_id, exc)
                return
            self._last_frame_at = time.monotonic()
            with gc_paused():
                for _ in range(_DRAIN_PER_TURN):
                    try:
                        frames = self._shadow.recv_multipart(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    await self._on_live(frames)
                await self._flush()
            await asyncio.sleep(0)

    async def _on_live(self, frames: list[bytes]) -> None:
        if len(frames) != 3 or len(frames[1]) != 8:
            self._decode_error(f"expected 3 frames [topic, seq(8B), payload], got {len(frames)}")
            return
        seq = int.from_bytes(frames[1], "big")
        batch, stats = self._decode(frames[2], seq)
        if batch is None:
            # Corrupted in transit? The publisher's buffer holds its own copy, fetched
            # once per run of bad frames (a copy bad there too stays skipped, counted).
            self._note_undecodable(seq)
            return
        rank = batch.data_parallel_rank or 0
        if self._resumed_open:
            await self._restarted_while_away(rank, seq, frames[2])
        decision = self._seq.observe_live(rank, seq)
        verdict = decision.verdict
        if self._refetch is not None:  # fetch it before what follows it is applied
            if verdict is Verdict.APPLY or verdict is Verdict.DUPLICATE:
                await self._refetch_undecodable()
            else:
                self._refetch = None  # the recovery below replays from before it
        if verdict is not Verdict.DUPLICATE:  # a replay applied it: counted then
            self._count_decoded(stats)
        if (verdict is Verdict.RESTART or self._conflict.open) and await self._conflicting(
            verdict, rank, seq
        ):
            return  # two publishers' frames: nothing of them is applied
        if verdict is Verdict.APPLY:
            await self._apply_if_new(seq, batch, frames[2])
        elif verdict is Verdict.DUPLICATE:
            self.counters.duplicates += 1  # already applied from a replay
        else:
            await self._not_next(decision, rank, seq, batch, frames[2])

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
    def _decode(self, payload: bytes, seq: int) -> tuple[KVEventBatch | None, DecodeStats | None]:
        """The batch (None if undecodable or of a rank out of bounds) and what decoding it
        counted, for ``_count_decoded`` once the frame is known new (None: packed form)."""
        batch = packed.decode(payload)
        stats: DecodeStats | None = None
        try:
            if batch is None:
                stats = DecodeStats()
                batch = decode_batch(payload, stats)
            if not 0 <= (rank := batch.data_parallel_rank or 0) < MAX_RANKS:
                raise DecodeError(f"data_parallel_rank {rank} is outside [0, {MAX_RANKS})")
            return batch, stats
        except DecodeError as exc:
            if not self._seq.is_bad(seq):  # else bad at the source too: its replayed copy
                self._seq.mark_bad(seq)
                self._decode_error(f"seq {seq}: {exc}")
            return None, stats

    def _count_decoded(self, stats: DecodeStats | None) -> None:
        if stats is None:
            self.decode_stats.batches += 1
        else:
            self.decode_stats.add(stats)

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
