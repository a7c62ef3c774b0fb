"""Chain starts taken for re-announcements that a later store proves were recomputes.

Why: a request that skips the prefix cache (prompt logprobs) recomputes a prefix the
worker holds from 0, and its first store has the shape of a re-announcement; at that
point of the stream nothing tells them apart, so ``router.ingest.reannounce`` takes it
for one (one copy too few, never one too many). The request's *next* store tells: it
continues the chain start's last block with at least two whole blocks, the first of
which the worker held and held already when the chain start came. A request that read
the prefix cache would have hit that block (its prompt is longer than the block, so
vLLM's cap ``num_tokens - 1`` does not cut it) instead of computing it again; only a
request that skipped the cache recomputes it -- and such a request's chain start is
never a re-announcement (its lookup is 0). So the chain start's blocks get the copy
they were denied. This holds for workers with full attention only and no EAGLE: with
another group (a sliding window, mamba) a lookup can stop before a held full-attention
block because the other group cannot serve a longer hit, and EAGLE drops the last
matched block, so a request that read the cache recomputes that block too.

Kept safe: a block of the chain start removed since is not given its copy back (the
removal may have taken the copy the index lacked), and a continuation whose first block
was stored after the chain start -- or after any earlier store that ended where the
continuation starts, which may be the continuing request's own earlier chunk, its
lookup made before that block existed -- proves nothing. Such an earlier store is
forgotten once a copy of its last block is removed (a running request's blocks cannot
be evicted); what is not covered: that request still running while a second copy of the
same block, computed by another request, is evicted -- then a re-announcement of exactly
that prefix and its next chunk could add a copy too many.
"""

from __future__ import annotations

from dataclasses import dataclass

from router.index.base import GPU_BIT, BlockKey, EngineHash, StoreOp

RECORDS_CAP = 64  # chain starts remembered per worker
RECORD_AGE = 4096  # events after which a chain start is forgotten
LOG_CAP = 65536  # (group, hash) positions kept before the log is pruned


@dataclass
class Record:
    """A chain start taken for a re-announcement (with its partners)."""

    pos: int
    group: int
    last: EngineHash
    blocks: list[tuple[int, list[EngineHash], list[BlockKey]]]  # (group, hashes, keys)


class RecomputeLog:
    """Per worker: recent re-announcement calls, and for the last ``RECORD_AGE``-odd
    events (stream positions) when each (group, hash) was last stored or removed on GPU
    and when a store first ended at it."""

    def __init__(self) -> None:
        self.pos = 0
        self.records: dict[tuple[int, EngineHash], Record] = {}
        self._stored: dict[tuple[int, EngineHash], int] = {}
        self._removed: dict[tuple[int, EngineHash], int] = {}
        self._ends: dict[tuple[int, EngineHash], int] = {}
        # This batch's corrections, by the index of the event they go before.
        self.fixes: dict[int, list[StoreOp]] = {}

    def record(self, rec: Record) -> None:
        self.records[(rec.group, rec.last)] = rec
        while len(self.records) > RECORDS_CAP:
            del self.records[next(iter(self.records))]

    def follows(self, group: int, parent: EngineHash | None) -> Record | None:
        """The chain start a store continues, if one is remembered."""
        if parent is None or not self.records:
            return None
        return self.records.get((group, parent))

    def note(self, group: int, hashes: list[EngineHash], stored: bool) -> None:
        log = self._stored if stored else self._removed
        for h in hashes:
            log[(group, h)] = self.pos
            if not stored:
                # A running request's blocks cannot be evicted: whatever store ended
                # here is no chunk of a request still computing (but see the doc).
                self._ends.pop((group, h), None)

    def note_end(self, group: int, last: EngineHash) -> None:
        """A store (or re-announcement) ends at ``last``: a request may continue it."""
        self._ends.setdefault((group, last), self.pos)

    def proves(self, rec: Record, first: EngineHash) -> bool:
        """A continuation of ``rec``'s last block starting with ``first`` (held now)
        proves a recompute when ``first`` was stored before any store ended where the
        continuation starts: whichever earlier chunk the continuing request computed,
        ``first`` was held when that request looked the cache up."""
        stored = self._stored.get((rec.group, first))
        if stored is None:  # stored before what the log holds: when is unknown
            return False
        start = self._ends.get((rec.group, rec.last), rec.pos)
        return stored < min(start, rec.pos)

    def correct(self, i: int, rec: Record) -> list[tuple[int, list[EngineHash]]]:
        """Give ``rec``'s blocks their copy back (before event ``i``); returns what was
        given, for the caller's view of the stream."""
        del self.records[(rec.group, rec.last)]
        given: list[tuple[int, list[EngineHash]]] = []
        for g, hashes, keys in rec.blocks:
            keep = [
                (h, k)
                for h, k in zip(hashes, keys, strict=True)
                if self._removed.get((g, h), -1) < rec.pos
            ]
            if keep:
                hs, ks = [h for h, _ in keep], [k for _, k in keep]
                self.fixes.setdefault(i, []).append(StoreOp(g, GPU_BIT, hs, ks))
                given.append((g, hs))
        return given

    def advance(self) -> None:
        """One event processed; forget what is too old to matter."""
        self.pos += 1
        oldest = self.pos - RECORD_AGE
        if self.records and next(iter(self.records.values())).pos < oldest:
            self.records = {k: r for k, r in self.records.items() if r.pos >= oldest}
        if self.pos % 1024 == 0:  # amortised: a scan of the log
            age = RECORD_AGE
            while age and len(self._stored) + len(self._removed) + len(self._ends) > LOG_CAP:
                cut = self.pos - age
                self._stored = {k: p for k, p in self._stored.items() if p >= cut}
                self._removed = {k: p for k, p in self._removed.items() if p >= cut}
                self._ends = {k: p for k, p in self._ends.items() if p >= cut}
                self.records = {k: r for k, r in self.records.items() if r.pos >= cut}
                age //= 2

    def clear(self) -> None:
        """AllBlocksCleared: nothing before it can be corrected."""
        self.records.clear()
        self._stored.clear()
        self._removed.clear()
        self._ends.clear()
