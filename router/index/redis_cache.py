"""The Redis index's client-side cache of engine hash -> block key mappings.

Split from ``router.index.redis``. Why a cache: parents of stores from earlier batches
are resolved before a batch is written, and a round trip per batch for mappings this
process wrote itself would halve ingest. It holds mappings this process wrote (once
Redis took the write) or read; a removal evicts its hashes (the server may drop their
map entries), so the cache answers exactly like the map -- for this replica's writes.
Replicas sharing one Redis: every worker carries a random *epoch* token, replaced at
every clear and when it is created again; cached mappings are trusted only under the
epoch they were learned in (``check_epoch``, fed by ``resolve`` and every ``APPLY``).
A resolve answered wholly from the cache costs no round trip (it did one per batch, half
the ingest wall time): every ``APPLY`` carries the epoch its plan assumed and the script
refuses, atomically, a plan made under another (``RedisIndex.apply_many``).
"""

from __future__ import annotations

from collections.abc import Sequence

from router.index.base import BlockKey, EngineHash


class MappingCache:
    """Bounded per-(worker, block size) mappings with a per-worker epoch."""

    def __init__(self, limit: int) -> None:
        self._cache: dict[tuple[str, int], dict[EngineHash, BlockKey]] = {}
        self._epochs: dict[str, bytes | None] = {}
        self._cached = 0
        self._limit = limit

    def get(self, worker_id: str, bs: int) -> dict[EngineHash, BlockKey]:
        return self._cache.get((worker_id, bs), {})

    def remember(self, worker_id: str, bs: int, pairs: dict[EngineHash, BlockKey]) -> None:
        if self._cached + len(pairs) > self._limit:
            self._cache.clear()  # bounded: drop everything, misses go back to Redis
            self._cached = 0
        cache = self._cache.setdefault((worker_id, bs), {})
        before = len(cache)
        cache.update(pairs)
        self._cached += len(cache) - before

    def remember_lists(
        self, worker_id: str, bs: int, hashes: Sequence[EngineHash], keys: Sequence[BlockKey]
    ) -> None:
        """``remember`` of ``zip(hashes, keys)`` without building the dict first."""
        if self._cached + len(hashes) > self._limit:
            self._cache.clear()
            self._cached = 0
        cache = self._cache.setdefault((worker_id, bs), {})
        before = len(cache)
        cache.update(zip(hashes, keys, strict=True))
        self._cached += len(cache) - before

    def unremember(self, worker_id: str, bs: int, hashes: Sequence[EngineHash]) -> None:
        cache = self._cache.get((worker_id, bs))
        if cache:
            before = len(cache)
            for h in hashes:
                cache.pop(h, None)
            self._cached -= before - len(cache)

    def forget(self, worker_id: str) -> None:
        for key in [k for k in self._cache if k[0] == worker_id]:
            self._cached -= len(self._cache.pop(key))

    def drop(self, worker_id: str) -> None:
        """The worker is gone: its mappings and its epoch entry (workers that come and go
        under fresh ids must not grow the table)."""
        self.forget(worker_id)
        self._epochs.pop(worker_id, None)

    def check_epoch(self, worker_id: str, epoch: bytes | None) -> bool:
        """Drop the worker's cached mappings unless they were learned in ``epoch`` (the
        server's); True when they were kept."""
        if worker_id in self._epochs and self._epochs[worker_id] == epoch:
            return True
        self.forget(worker_id)
        self._epochs[worker_id] = epoch
        return False

    def epoch(self, worker_id: str) -> bytes | None:
        """The epoch the worker's cached mappings were learned in (None: unknown)."""
        return self._epochs.get(worker_id)
