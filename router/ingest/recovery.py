"""Recovery for a worker's subscription: catch-up, replay, resync, repair.

Why apart from the live loop (``router.ingest.subscription``): every way the router
gets back in step with an engine lives here -- the catch-up replay after a (re)connect
that also tells a restarted publisher from one that carried on, gap and corrupted-frame
replays, the idle-time check for a lost tail, resyncs (clear and rebuild from the
publisher's buffer, with ``partial_history`` when the rebuild does not reach seq 0), the
repair of failed index writes, resuming from the seqs a shared index recorded, and the
refetch of frames that arrived undecodable (one replay per run of them, not per frame).
``WorkerSubscription`` mixes it in; the state it reads is the subscription's own.
"""

from __future__ import annotations

import logging
import time
import zlib
from typing import TYPE_CHECKING, Any

from router.ingest.replay_client import (
    MAX_SEQ,
    ReplayFailed,
    ReplayFrame,
    ReplayTooLarge,
    request_replay,
)
from schemas import DecodeStats, KVEventBatch

if TYPE_CHECKING:
    from router.config import RouterSettings, WorkerSpec
    from router.ingest.sequencing import SeqTracker
    from router.ingest.writer import IndexWriter
    from router.ratelimited_log import RateLimitedLog

log = logging.getLogger("router.ingest.subscription")

# Backoff of the clear-and-replay repair after a failed index write (doubles per failure).
REPAIR_FIRST_S = 0.2
REPAIR_MAX_S = 30.0


class RecoveryMixin:
    """Recovery steps of ``WorkerSubscription`` (see the module docstring)."""

    # Provided by WorkerSubscription.
    worker_id: str
    spec: WorkerSpec
    counters: Any
    decode_stats: DecodeStats
    syncing: bool
    faulted: bool
    partial_history: bool
    _ctx: Any
    _settings: RouterSettings
    _seq: SeqTracker
    _writer: IndexWriter
    _limited: RateLimitedLog
    _repair_at: float | None
    _repair_delay: float
    _resync_why: str | None
    _last_frame_at: float
    _tail_checked_at: float
    # Seqs (lowest, highest) of live frames that arrived undecodable, not refetched yet.
    _refetch: tuple[int, int] | None = None
    # When the replay now running began: live frames wait meanwhile (``lag_seconds``).
    _recovering_since: float | None = None
    # libzmq ended the connection for good (a message over ``sub_max_message_bytes``)
    # and it was opened again: the catch-up that follows fills a gap, counted as one.
    _reopened: bool = False

    def _event(self, event: str, **fields: object) -> dict[str, object]:
        raise NotImplementedError

    def _decode(self, payload: bytes, seq: int) -> tuple[KVEventBatch | None, DecodeStats | None]:
        raise NotImplementedError

    def _count_decoded(self, stats: DecodeStats | None) -> None:
        raise NotImplementedError

    async def _apply_if_new(self, seq: int, batch: KVEventBatch, payload: bytes) -> None:
        raise NotImplementedError

    async def _resume_from_index(self) -> dict[int, tuple[int, int]]:
        """Before anything else: a router restarted on a shared index (Redis) resumes
        where the index says it was -- per rank the last applied seq and its payload's
        fingerprint -- so the catch-up replay applies only what is new and notices a
        publisher that restarted meanwhile. Entries without recorded seqs cannot be
        matched with the stream: they are cleared and rebuilt. Returns what it resumed
        from: per rank (seq, fingerprint)."""
        persisted = await self._writer.persisted_seqs()
        if persisted:
            for rank, (seq, fingerprint) in persisted.items():
                self._seq.mark_applied(rank, seq, fingerprint)
                self._writer.written[rank] = seq
        elif await self._writer.holds_entries():
            await self._clear("the index holds this worker's entries without their seqs")
        return persisted

    def request_resync(self, why: str) -> None:
        """Clear and rebuild from the publisher's buffer, in this subscription's task."""
        self._resync_why = why

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
        if top >= MAX_SEQ:
            return  # the last 8-byte seq: nothing can follow it
        frames = await self._fetch_replay(top + 1, quiet=True)
        if frames and frames[0].seq != top + 1:
            # Not what follows our last seq (no live seq bounds this answer): a bad reply,
            # or a buffer that moved past it, which the next live frame's gap replay
            # rebuilds from. Nothing of it is applied.
            self._limited.warning(
                "tail_mismatch",
                "worker %s: the replay after seq %d starts at seq %d; not applied",
                self.worker_id,
                top,
                frames[0].seq,
                extra=self._event("tail_mismatch", seq=top, first=frames[0].seq),
            )
        elif frames:
            self.counters.gaps += 1
            self._limited.warning(
                "lost_tail",
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
        reopened, self._reopened = self._reopened, False
        if top is None or not seq.shared:  # nothing to compare with: plain catch-up
            await self._recover(start=0 if top is None else top, quiet=True)
            return
        got = await self._fetch_replay(top, quiet=True)
        if got is None:
            return
        same = bool(got) and got[0].seq == top and zlib.crc32(got[0].payload) == fingerprint
        if same:
            if reopened and len(got) > 1:  # the refused message is among them
                self.counters.gaps += 1
                self._limited.warning(
                    "reopen_gap",
                    "worker %s: %d frame(s) after seq %d missed while the connection was "
                    "reopened; replayed",
                    self.worker_id,
                    len(got) - 1,
                    top,
                    extra=self._event("gap", first_missing=top + 1, frames=len(got) - 1),
                )
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

    def _note_undecodable(self, seq: int) -> None:
        """A live frame at ``seq`` did not decode; the publisher's buffer may hold a good
        copy. Noted, not fetched at once: each replay may wait ``replay_timeout_s``, so a
        run of bad frames is fetched with one replay (``_refetch_undecodable``) before the
        next good frame is applied, or when the stream goes quiet."""
        if self.spec.replay_endpoint is None:
            return
        run = self._refetch
        self._refetch = (seq, seq) if run is None else (min(run[0], seq), max(run[1], seq))

    async def _refetch_undecodable(self) -> None:
        if self._refetch is not None:
            (start, upto), self._refetch = self._refetch, None
            await self._recover(start=start, quiet=True, upto=upto)

    async def _resync_from(self, seq: int, batch: KVEventBatch, payload: bytes) -> None:
        if seq > 0 and self.spec.replay_endpoint is not None:
            await self._recover(start=0, clear_first=True, upto=seq)
        else:
            await self._clear("publisher restarted")
        await self._apply_if_new(seq, batch, payload)

    async def _recover(
        self,
        *,
        start: int,
        clear_on_miss: bool = False,
        clear_first: bool = False,
        quiet: bool = False,
        why: str = "publisher restarted",
        upto: int | None = None,
    ) -> None:
        """Replay from ``start`` and apply what it returns exactly once.

        ``clear_on_miss``: the replay must begin at ``start`` or the stream has a hole we
        cannot fill, so the worker is cleared and rebuilt from the buffer instead.
        ``upto``: the live seq that asked for the replay; nothing past it is taken from
        the answer (it follows live), so a replayed seq can never run ahead of the stream.
        """
        self.syncing = not quiet  # a catch-up after connecting is not a resync
        self._recovering_since = time.monotonic()
        # Nothing applied yet (a router that just started on an empty index, or one that
        # joined mid-stream): a replay from 0 is the whole history we will ever have.
        fresh = start == 0 and self._seq.top_seq is None
        try:
            if clear_first:
                await self._clear(why)
            got = await self._fetch_replay(start, quiet=quiet, upto=upto)
            frames = got or []
            first = frames[0].seq if frames else None
            if clear_on_miss and (first is None or first > start):
                await self._clear(f"replay cannot fill from {start} (buffer starts at {first})")
                clear_first = True
            if clear_first or fresh:  # the index holds this replay's history only
                self._mark_history(got, start, upto, rebuilt=clear_first)
            await self._apply_replayed(frames)
            await self._flush()
        finally:
            self.syncing = False
            self._recovering_since = None

    def _mark_history(
        self, got: list[ReplayFrame] | None, start: int, upto: int | None, *, rebuilt: bool
    ) -> None:
        """After a replay that is all the index holds of the worker (``got``; None: it
        failed): complete if it reached seq 0 (or, asked from 0 with nothing live to
        compare, the publisher has published nothing), else -- a failed replay too --
        partial, where there is history to miss: a rebuild, a live frame past 0
        (``upto``), a buffer past 0."""
        first = got[0].seq if got else None
        if first == 0 or (got == [] and start == 0 and upto is None):
            self.partial_history = False
        elif rebuilt or upto is not None or first is not None:
            self._history_is_partial(first if first is not None else upto)

    def _history_is_partial(self, first: int | None) -> None:
        """Nothing before seq ``first`` (None: before the next batch) is in the index."""
        if not self.partial_history:
            self._limited.warning(
                "partial_history",
                "worker %s: history before %s is unknown; estimates are lower bounds until "
                "the engine clears its cache",
                self.worker_id,
                "the next batch" if first is None else f"seq {first}",
                extra=self._event("partial_history", seq=first),
            )
        self.partial_history = True

    async def _fetch_replay(
        self, start: int, *, quiet: bool, upto: int | None = None
    ) -> list[ReplayFrame] | None:
        """The publisher's buffered frames from ``start`` (to ``upto``) on our topic; None
        on failure. Replies off the protocol (``replay_client``) are counted and skipped."""
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
                upto=upto,
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
        if malformed:
            self.counters.decode_errors += malformed
            self._limited.warning(
                "replay_malformed",
                "worker %s: %d replay replies skipped (not the replay shape, or a seq below "
                "%d, out of order, or not following the previous one)",
                self.worker_id,
                malformed,
                start,
                extra=self._event("replay_malformed", start=start, replies=malformed),
            )
        prefix = self.spec.topic.encode()  # an answer without topics is this publisher's
        return [f for f in frames if f.topic is None or f.topic.startswith(prefix)]

    async def _apply_replayed(self, frames: list[ReplayFrame]) -> None:
        """Apply the frames not applied yet; a replay overlaps what was decoded live, so
        decoder counters count a frame only when it is new (once per seq)."""
        for frame in frames:
            batch, stats = self._decode(frame.payload, frame.seq)
            if batch is None:
                continue
            if self._seq.is_new(batch.data_parallel_rank or 0, frame.seq):
                self._count_decoded(stats)
            await self._apply_if_new(frame.seq, batch, frame.payload)

    async def _clear(self, why: str) -> None:
        self._limited.warning(
            "resync",
            "worker %s: clearing its index entries and rebuilding (%s)",
            self.worker_id,
            why,
            extra=self._event("resync", reason=why),
        )
        self.counters.resyncs += 1
        self._seq.forget_applied()
        self._refetch = None  # what follows is replayed from 0, or nothing is
        await self._writer.clear()

    async def _flush(self) -> None:
        """Write what is staged. A write that failed (not an outage: a bug, a bad
        backend reply) leaves the index without those batches: the worker is marked
        ``faulted`` and repaired -- cleared and rebuilt from the publisher's buffer --
        after a backoff that doubles while repairs fail, so a fault that persists costs
        a repair every ``REPAIR_MAX_S`` at most, never a hot loop."""
        await self._writer.flush()
        if self._writer.failed:
            self._writer.failed = False
            self._fault()
        self._check_deferred()

    def _check_deferred(self) -> None:
        """A shared index keeps deferring this worker's batches without moving on: the
        router that cleared the worker to rebuild it stopped midway (``SeqOp.follows``),
        and only a rebuild here puts the history back in order."""
        limit = self._settings.index_defer_max_s
        waited = self._writer.deferred_for()
        if limit and waited > limit and self._resync_why is None:
            self.request_resync(
                f"the shared index stood still for {waited:.0f}s behind this router's "
                "position (another router's rebuild of the worker stopped)"
            )

    def _fault(self) -> None:
        self.faulted = True
        if self._repair_at is None:
            self._repair_at = time.monotonic() + self._repair_delay
            self._repair_delay = min(self._repair_delay * 2, REPAIR_MAX_S)

    async def _repair(self) -> None:
        self._repair_at = None
        await self._clear("an index write failed")
        got = None  # no replay endpoint: nothing to rebuild from
        if self.spec.replay_endpoint is not None:
            got = await self._fetch_replay(0, quiet=False)
            await self._apply_replayed(got or [])
        self._mark_history(got, 0, None, rebuilt=True)
        await self._writer.flush()
        if self._writer.failed or self._writer.clear_failed:
            self._writer.failed = self._writer.clear_failed = False
            self._fault()
            return
        self.faulted = False
        self._repair_delay = REPAIR_FIRST_S
        log.info(
            "worker %s: repaired after a failed index write",
            self.worker_id,
            extra=self._event("worker_repaired"),
        )
