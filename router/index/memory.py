"""The in-process index (default): plain dicts shaped for the two hot paths.

Per worker: ``media[group]`` maps block key -> media bitmask (a small int, so Python's
cached small ints cost nothing per entry) and ``maps[block_size]`` maps engine hash ->
block key, shared by the groups of one block size (they carry the same hashes), whose
``setdefault`` also makes those groups share one key object. Reads go through
``map``/``takewhile``/``bytes`` so the per-block work of a score stays in C.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from itertools import repeat, takewhile

from router.index.base import (
    BIT_MEDIA,
    ApplyResult,
    BlockKey,
    ClearOp,
    EngineHash,
    GroupMeta,
    IndexBackend,
    Op,
    StoreOp,
    WorkerSnapshot,
    WorkerState,
)

_BIT_SLOT = {1: 0, 2: 1, 4: 2}
# Rough per-object sizes for the stats estimate (a 64-bit key / engine-hash int).
_INT_BYTES = sys.getsizeof(2**63)


class _Worker:
    __slots__ = ("counts", "maps", "media", "plan", "state")

    def __init__(self, state: WorkerState) -> None:
        self.media: dict[int, dict[BlockKey, int]] = {}
        self.maps: dict[int, dict[EngineHash, BlockKey]] = {}
        self.counts: dict[int, list[int]] = {}
        self.set_state(state)

    def set_state(self, state: WorkerState) -> None:
        self.state = WorkerState(dict(state.groups), state.hash_mode)
        # Full-attention groups first: their prefix bounds what the others need to read.
        order = sorted(state.groups.items(), key=lambda kv: (kv[1].rule != "full", kv[0]))
        self.plan = [(g, m.block_size, m.rule == "full") for g, m in order]

    def clear(self) -> None:
        self.media.clear()
        self.maps.clear()
        self.counts.clear()


class MemoryIndex(IndexBackend):
    """Dict-based backend; every coroutine completes without awaiting anything."""

    kind = "memory"

    def __init__(self) -> None:
        self._workers: dict[str, _Worker] = {}

    async def ping(self) -> bool:
        return True

    async def close(self) -> None:
        self._workers.clear()

    async def stats(self) -> dict[str, int | float | str]:
        entries = map_entries = size = 0
        for w in self._workers.values():
            for d in w.media.values():
                entries += len(d)
                size += sys.getsizeof(d)
            for m in w.maps.values():
                map_entries += len(m)
                size += sys.getsizeof(m)
        # Keys are shared between a map and its groups; engine hashes are held by the map.
        size += 2 * map_entries * _INT_BYTES
        return {
            "backend": self.kind,
            "workers": len(self._workers),
            "entries": entries,
            "map_entries": map_entries,
            "bytes": size,
            "bytes_per_entry": round(size / entries, 1) if entries else 0.0,
        }

    async def load_worker(self, worker_id: str) -> WorkerState | None:
        w = self._workers.get(worker_id)
        if w is None:
            return None
        return WorkerState(dict(w.state.groups), w.state.hash_mode)

    async def save_worker(self, worker_id: str, state: WorkerState) -> None:
        w = self._workers.get(worker_id)
        if w is None:
            self._workers[worker_id] = _Worker(state)
        else:
            w.set_state(state)

    async def known_workers(self) -> list[str]:
        return sorted(self._workers)

    async def resolve(
        self, worker_id: str, block_size: int, hashes: Sequence[EngineHash]
    ) -> list[BlockKey | None]:
        w = self._workers.get(worker_id)
        emap = w.maps.get(block_size) if w is not None else None
        if not emap:
            return [None] * len(hashes)
        return list(map(emap.get, hashes))

    async def apply(
        self, worker_id: str, groups: dict[int, GroupMeta], ops: Sequence[Op]
    ) -> ApplyResult:
        w = self._workers.get(worker_id)
        if w is None:
            w = self._workers[worker_id] = _Worker(WorkerState(dict(groups)))
        elif w.state.groups != groups:
            w.set_state(WorkerState(dict(groups), w.state.hash_mode))
        res = ApplyResult()
        for op in ops:
            if isinstance(op, ClearOp):
                w.clear()
                continue
            g = op.group
            bs = groups[g].block_size
            d = w.media.get(g)
            if d is None:
                d = w.media[g] = {}
            emap = w.maps.get(bs)
            if emap is None:
                emap = w.maps[bs] = {}
            counts = w.counts.get(g)
            if counts is None:
                counts = w.counts[g] = [0, 0, 0]
            bit = op.medium_bit
            get = d.get
            if isinstance(op, StoreOp):
                new = 0
                setdefault = emap.setdefault
                for h, k in zip(op.hashes, op.keys, strict=True):
                    k = setdefault(h, k)
                    m = get(k, 0)
                    if not m & bit:
                        d[k] = m | bit
                        new += 1
                res.stored += new
                res.stored_repeat += len(op.hashes) - new
                counts[_BIT_SLOT[bit]] += new
                continue
            siblings = [
                w.media[g2]
                for g2, m2 in groups.items()
                if g2 != g and m2.block_size == bs and g2 in w.media
            ]
            gone = 0
            for h in op.hashes:
                k = emap.get(h)
                m = 0 if k is None else get(k, 0)
                if not m & bit:
                    continue
                gone += 1
                m ^= bit
                if m:
                    d[k] = m
                else:
                    del d[k]
                    if not any(k in s for s in siblings):
                        del emap[h]
            res.removed += gone
            res.removed_missing += len(op.hashes) - gone
            counts[_BIT_SLOT[bit]] -= gone
        return res

    async def clear_worker(self, worker_id: str) -> None:
        w = self._workers.get(worker_id)
        if w is not None:
            w.clear()

    async def remove_worker(self, worker_id: str) -> None:
        self._workers.pop(worker_id, None)

    async def group_counts(self, worker_id: str) -> dict[int, dict[str, int]]:
        w = self._workers.get(worker_id)
        if w is None:
            return {}
        return {
            g: {medium: c[_BIT_SLOT[bit]] for bit, medium in BIT_MEDIA if c[_BIT_SLOT[bit]]}
            for g, c in sorted(w.counts.items())
        }

    async def fetch(
        self, worker_ids: Sequence[str], keys_by_size: dict[int, Sequence[BlockKey]]
    ) -> dict[str, WorkerSnapshot | None]:
        out: dict[str, WorkerSnapshot | None] = {}
        for wid in worker_ids:
            w = self._workers.get(wid)
            if w is None:
                out[wid] = None
                continue
            masks: dict[int, bytes] = {}
            bound: int | None = None  # tokens: the shortest full-attention prefix
            for g, bs, full in w.plan:
                keys = keys_by_size.get(bs)
                if keys is None:
                    continue
                d = w.media.get(g)
                if full:
                    got = bytes(takewhile(bool, map(d.get, keys))) if d else b""
                    bound = len(got) * bs if bound is None else min(bound, len(got) * bs)
                else:
                    n = len(keys) if bound is None else min(len(keys), bound // bs)
                    if not d or n <= 0:
                        got = b""
                    else:
                        got = bytes(map(d.get, keys[:n], repeat(0))).rstrip(b"\0")
                masks[g] = got
            out[wid] = WorkerSnapshot(dict(w.state.groups), masks)
        return out
