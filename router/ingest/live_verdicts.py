"""What a live frame that is not simply the next one sets off.

Why apart from the live loop (``router.ingest.subscription``): the loop decodes a frame
and asks ``router.ingest.sequencing`` what it is; everything that follows from a frame
that is not the next seq lives here -- a seq that went back (a publisher that restarted,
or two publishers under one topic: ``router.ingest.conflicts``), a first frame
mid-stream, and a gap -- each ending in a replay, a resync or a clear
(``router.ingest.recovery``).
"""

from __future__ import annotations

import time
import zlib
from typing import TYPE_CHECKING

from router.ingest.conflicts import PublisherConflict
from router.ingest.recovery import RecoveryMixin
from router.ingest.sequencing import Decision, Verdict

if TYPE_CHECKING:
    from schemas import KVEventBatch

# How far below the index's last seq a live frame may be and still be one that another
# router sharing the index applied first (frames in flight while this one resumed).
RESUME_LEAD = 256


class LiveVerdictsMixin(RecoveryMixin):
    """Rewinds, joins and gaps of ``WorkerSubscription`` (see the module docstring)."""

    _conflict: PublisherConflict  # the subscription's
    # Resumed from a shared index without a replay endpoint: per rank, the (seq,
    # fingerprint) the index recorded, until a live frame tells whether the engine
    # restarted while no router listened (``_restarted_while_away``).
    _resumed_open: dict[int, tuple[int, int]] | None = None

    async def _resume(self) -> None:
        """Resume from what a shared index recorded (``RecoveryMixin``)."""
        persisted = await self._resume_from_index()
        if self.spec.replay_endpoint is None and persisted:
            self._resumed_open = dict(persisted)

    async def _restarted_while_away(self, rank: int, seq: int, payload: bytes) -> None:
        """Tell an engine that started over while no router listened from one that carried
        on, without a replay endpoint (with one, the catch-up replay tells it): a live seq
        far below the rank's recorded one (``RESUME_LEAD``), or that seq itself with
        another payload, is a new process, and the worker is cleared. Seqs a little below
        it may be frames another router sharing the index applied first: they stay
        duplicates until the recorded seq shows which it is."""
        opened = self._resumed_open
        if opened is None or rank not in opened:
            return
        last, fingerprint = opened[rank]
        if last - RESUME_LEAD <= seq < last:
            return  # still open
        del opened[rank]
        if seq < last or (seq == last and zlib.crc32(payload) != fingerprint):
            self._resumed_open = None
            await self._clear("publisher restarted while the router was away")

    @property
    def in_conflict(self) -> bool:
        """Two publishers seem to share this worker's topic (state ``conflict``)."""
        return self._conflict.active(time.monotonic())

    async def _conflicting(self, verdict: Verdict, rank: int, seq: int) -> bool:
        """Whether this frame belongs to a conflict, and is dropped: the first rewind of
        one clears the worker (its entries mix two caches); once the rewinds stop, the
        worker is rebuilt."""
        now = time.monotonic()
        if verdict is Verdict.RESTART and self._conflict.rewound(now):
            self._limited.error(
                "conflict",
                "worker %s rank %d: seq went back %d times within %.0f s (now to %d): two "
                "publishers under topic %r? Its entries are cleared and its frames dropped "
                "until this stops (give each engine its own topic)",
                self.worker_id,
                rank,
                self._conflict.restarts,
                self._conflict.window_s,
                seq,
                self.spec.topic,
                extra=self._event("publisher_conflict", rank=rank, seq=seq),
            )
            await self._clear("two publishers under one topic")
        if self._conflict.active(now):
            return True
        if self._conflict.ended(now):
            self.request_resync("the publishers under its topic no longer conflict")
        return False

    async def _not_next(self, decision: Decision, rank: int, seq: int, batch: KVEventBatch,
                        payload: bytes) -> None:  # fmt: skip
        """A frame that is not the next seq: rewind, join or gap."""
        verdict = decision.verdict
        if verdict is Verdict.RESTART:
            self._limited.warning(
                "restart",
                "worker %s rank %d: seq went back to %d (publisher restarted); resyncing",
                self.worker_id,
                rank,
                seq,
                extra=self._event("publisher_restarted", rank=rank, seq=seq),
            )
            await self._resync_from(seq, batch, payload)
        elif verdict is Verdict.JOIN:  # mid-stream: fetch what is buffered, else unknown
            if self.spec.replay_endpoint is not None:
                await self._recover(start=0, upto=seq)  # keeping nothing old
            else:
                self._history_is_partial(seq)
            await self._apply_if_new(seq, batch, payload)
        else:
            self.counters.gaps += 1
            self._limited.warning(
                "gap",
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
                await self._recover(start=decision.start, clear_on_miss=True, upto=seq)
            await self._apply_if_new(seq, batch, payload)
