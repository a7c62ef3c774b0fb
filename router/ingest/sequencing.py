"""Sequence bookkeeping of one worker's stream: what to do with each live frame.

A pure state machine (no I/O) so the subscriber's recovery logic is small and every odd
case is testable alone. Frames carry ``(data_parallel_rank, seq)``; two stream shapes
exist in the wild and both must work:

* **shared counter** - one publisher stamps batches of several ranks with one seq
  counter (the golden vLLM capture does this): seqs rise across ranks, so a gap is a
  hole in the *global* sequence;
* **per-rank counters** - several publishers (one per DP rank) merged onto one
  subscription: each rank counts from 0 on its own.

The tracker assumes a shared counter until a rank switch shows a seq that does not rise
(impossible with one counter), then tracks each rank apart. With a single rank - the
common case - both shapes are the same.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

# Undecodable seqs remembered so they are not mistaken for a gap.
BAD_SEQS_KEPT = 4096


class Verdict(Enum):
    APPLY = "apply"  # the next frame: apply it
    DUPLICATE = "duplicate"  # already applied (a replay covered it): drop
    GAP = "gap"  # frames are missing from ``start``: replay or resync
    JOIN = "join"  # first frame seen mid-stream: catch up from ``start`` (0) if possible
    RESTART = "restart"  # the seq went back: the publisher restarted


@dataclass(frozen=True, slots=True)
class Decision:
    verdict: Verdict
    start: int = 0


# DP ranks a worker's frames may name: each keeps a seq here, in the index and a
# ``kvroute_last_seq`` series, so a frame naming another is refused (vLLM numbers its
# ranks from 0 up to the data-parallel size).
MAX_RANKS = 1024

_APPLY = Decision(Verdict.APPLY)
_DUPLICATE = Decision(Verdict.DUPLICATE)
_RESTART = Decision(Verdict.RESTART)


@dataclass
class SeqTracker:
    applied: dict[int, int] = field(default_factory=dict)  # last applied seq per rank
    live: dict[int, int] = field(default_factory=dict)  # last live seq per rank
    shared: bool = True
    # The globally newest applied frame (seq, payload fingerprint): after a reconnect it
    # tells a publisher that carried on from one that restarted (``subscription``).
    top_seq: int | None = None
    top_print: int = 0
    _last_seq: int | None = None
    _last_rank: int | None = None
    _bad: dict[int, None] = field(default_factory=dict)

    def observe_live(self, rank: int, seq: int) -> Decision:
        """Classify a live frame; the caller applies it only for APPLY (after recovery
        for GAP/JOIN/RESTART, via ``is_new``)."""
        live = self.live.get(rank)
        if live is not None and seq <= live:
            # A new process: every rank's live history belongs to the old one.
            self.live = {rank: seq}
            self.shared = True
            self._last_seq, self._last_rank = seq, rank
            return _RESTART
        if (
            self.shared
            and self._last_seq is not None
            and rank != self._last_rank
            and seq <= self._last_seq
        ):
            self.shared = False  # a rank switch without a rising seq: separate counters
        self.live[rank] = seq
        self._last_seq, self._last_rank = seq, rank

        mine = self.applied.get(rank)
        if mine is not None and seq <= mine:
            return _DUPLICATE
        if self.shared and self.applied:
            if mine is None:
                return _APPLY  # a rank joining a shared stream
            prev: int | None = max(self.applied.values())
        else:
            prev = mine
        if prev is None:
            return _APPLY if seq == 0 else Decision(Verdict.JOIN, 0)
        if seq <= prev:
            return _DUPLICATE
        if seq == prev + 1 or self._only_bad_between(prev, seq):
            return _APPLY
        return Decision(Verdict.GAP, prev + 1)

    def is_new(self, rank: int, seq: int) -> bool:
        """True if ``seq`` of ``rank`` was not applied yet (replayed frames, overlaps)."""
        mine = self.applied.get(rank)
        return mine is None or seq > mine

    def mark_applied(self, rank: int, seq: int, fingerprint: int = 0) -> None:
        self.applied[rank] = seq
        if self.top_seq is None or seq >= self.top_seq:
            self.top_seq, self.top_print = seq, fingerprint

    def is_bad(self, seq: int) -> bool:
        """True if ``seq`` was already seen undecodable (counted once)."""
        return seq in self._bad

    def mark_bad(self, seq: int) -> None:
        """An undecodable frame consumed ``seq``: not a gap later."""
        self._bad[seq] = None
        if len(self._bad) > BAD_SEQS_KEPT:
            del self._bad[next(iter(self._bad))]

    def forget_applied(self) -> None:
        """The worker's entries were cleared: everything that follows is new."""
        self.applied.clear()
        self._bad.clear()
        self.top_seq, self.top_print = None, 0

    def forget_live(self) -> None:
        """A new publisher process: its seqs start over on every rank."""
        self.live.clear()
        self.shared = True
        self._last_seq = self._last_rank = None

    def _only_bad_between(self, prev: int, seq: int) -> bool:
        if seq - prev - 1 > len(self._bad):
            return False
        return all(s in self._bad for s in range(prev + 1, seq))
