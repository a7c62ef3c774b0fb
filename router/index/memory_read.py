"""Read side of the in-process index: snapshots, matrices and bitsets for the scorer.

Split from ``router.index.memory`` (the write side and the layout's description): the
three read forms the scorer's paths use. ``fetch_bits`` hands out the tables themselves
(the fast path, ``router.score.bits``); ``fetch_columns`` and ``fetch`` turn each slot's
nibble into a media byte (numpy shifts, resp. a strided slice and ``translate``) for the
paths that need them: EAGLE workers, workers at another hash unit, comparisons in tests.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import repeat
from typing import Any

import numpy as np
from numpy.typing import NDArray

from router import native
from router.index.base import (
    Bits,
    BlockKey,
    Columns,
    IndexBackend,
    WorkerSnapshot,
)

# _NIBBLE[h]: bytes.translate table taking a byte to the media mask (1 GPU, 2 CPU,
# 4 STORAGE) of the slot in its low (h = 0) or high (h = 1) nibble.
_NIBBLE = [bytes((b >> (4 * h + 1)) & 7 for b in range(256)) for h in range(2)]


class MemoryReads(IndexBackend):
    """``fetch``, ``fetch_columns`` and ``fetch_bits`` over ``MemoryIndex``'s tables."""

    _workers: dict[str, Any]
    _tables: dict[int, dict[BlockKey, int]]
    _nslots: int
    _gen: int  # bumped whenever a worker's slot or metadata changes
    _bits_cache: dict[tuple[str, ...], tuple[int, Bits]]

    def _matrix(self, g: int, keys: Sequence[BlockKey], full: bool) -> NDArray[np.uint8]:
        """(keys x slots) media bitmasks of group ``g``; a full-attention group stops at
        the first key no worker holds (zeros follow)."""
        ns = max(self._nslots, 1)
        out = np.zeros((len(keys), ns), dtype=np.uint8)
        t = self._tables.get(g)
        if not t or not keys:
            return out
        vals = _values(t, keys, full)
        if not vals:
            return out
        n, width = len(vals), (ns + 1) // 2  # two slots per byte
        raw = native.pack(vals, width)
        rows = np.frombuffer(raw, dtype=np.uint8).reshape(n, width)
        out[:n, 0::2] = (rows >> 1) & 7
        out[:n, 1::2] = ((rows >> 5) & 7)[:, : ns // 2]
        return out

    def _slot_bytes(
        self, g: int, keys: Sequence[BlockKey], full: bool, slots: list[int]
    ) -> dict[int, bytes]:
        """Per slot, the media byte of each key (``fetch``'s snapshots): every value's
        bytes joined once, then per slot one strided slice and one ``translate`` -- all
        in C, no numpy call (the per-worker path serves small fleets, where a few
        fixed-cost calls are most of a score)."""
        t = self._tables.get(g)
        if not t or not keys:
            return dict.fromkeys(slots, b"")
        vals = _values(t, keys, full)
        if not vals:
            return dict.fromkeys(slots, b"")
        width = (self._nslots + 1) // 2  # two slots per byte
        raw = native.pack(vals, width)
        out = {slot: raw[slot // 2 :: width].translate(_NIBBLE[slot % 2]) for slot in slots}
        return out

    async def fetch(
        self, worker_ids: Sequence[str], keys_by_size: dict[int, Sequence[BlockKey]]
    ) -> dict[str, WorkerSnapshot | None]:
        out: dict[str, WorkerSnapshot | None] = {}
        found = []
        for wid in worker_ids:
            w = self._workers.get(wid)
            out[wid] = (
                None
                if w is None
                else WorkerSnapshot(dict(w.state.groups), {}, w.state.hash_unit, w.state.settings)
            )
            if w is not None:
                found.append((wid, w))
        bound: dict[str, int] = {}  # tokens: each worker's shortest full-attention prefix
        for full in (True, False):
            todo: dict[tuple[int, int], list[tuple[str, Any]]] = {}
            for wid, w in found:
                for g, bs, is_full in w.plan:
                    if is_full == full and bs in keys_by_size:
                        todo.setdefault((g, bs), []).append((wid, w))
            for (g, bs), members in todo.items():
                keys = keys_by_size[bs]
                if not full:
                    reach = max(bound.get(wid, len(keys) * bs) for wid, _ in members)
                    keys = keys[: reach // bs]
                cols = self._slot_bytes(g, keys, full, [w.slot for _, w in members])
                for wid, w in members:
                    col = cols[w.slot]
                    if full:
                        z = col.find(0)
                        got = col if z < 0 else col[:z]
                        reach = len(got) * bs
                        bound[wid] = min(bound.get(wid, reach), reach)
                    else:
                        got = col[: bound.get(wid, len(col) * bs) // bs].rstrip(b"\0")
                    snap = out[wid]
                    assert snap is not None
                    snap.masks[g] = got
        return out

    async def fetch_columns(
        self, worker_ids: Sequence[str], keys_by_size: dict[int, Sequence[BlockKey]]
    ) -> Columns:
        cohorts: dict[int, tuple[WorkerSnapshot, list[str]]] = {}
        unknown: list[str] = []
        slots: dict[str, int] = {}
        full_only: dict[tuple[int, int], bool] = {}
        workers = self._workers
        for wid in worker_ids:
            w = workers.get(wid)
            if w is None:
                unknown.append(wid)
                continue
            slots[wid] = w.slot
            c = cohorts.get(w.layout)
            if c is None:
                c = cohorts[w.layout] = (w.snap, [])
                for g, bs, is_full in w.plan:
                    if bs in keys_by_size:
                        full_only[(g, bs)] = full_only.get((g, bs), True) and is_full
            c[1].append(wid)
        mats = {
            (g, bs): self._matrix(g, keys_by_size[bs], full) for (g, bs), full in full_only.items()
        }
        return Columns(list(cohorts.values()), unknown, slots, mats, max(self._nslots, 1))

    async def fetch_bits(self, worker_ids: Sequence[str]) -> Bits:
        """Cohorts list their members by worker id (the scorer's tie order). The answer
        for a list of ids is reused until a worker is created, removed or changes its
        metadata (``_gen``): routers ask about the same fleet request after request, and
        the walk over the ids is what grew with workers. Callers never mutate it."""
        key = tuple(worker_ids)
        got = self._bits_cache.get(key)
        if got is not None and got[0] == self._gen:
            return got[1]
        bits = self._bits(worker_ids)
        if len(self._bits_cache) >= 64:
            self._bits_cache.clear()
        self._bits_cache[key] = (self._gen, bits)
        return bits

    def _bits(self, worker_ids: Sequence[str]) -> Bits:
        cohorts: dict[int, tuple[WorkerSnapshot, list[tuple[str, int]]]] = {}
        unknown: list[str] = []
        workers = self._workers
        for wid in worker_ids:
            w = workers.get(wid)
            if w is None:
                unknown.append(wid)
                continue
            c = cohorts.get(w.layout)
            if c is None:
                c = cohorts[w.layout] = (w.snap, [])
            c[1].append((wid, w.slot))
        masks = []
        for _, members in cohorts.values():
            members.sort()
            masks.append(sum(1 << (4 * s) for _, s in members))
        return Bits(list(cohorts.values()), unknown, self._tables, max(self._nslots, 1), masks)


def _values(table: dict[BlockKey, int], keys: Sequence[BlockKey], full: bool) -> list[int]:
    """The table's values for ``keys`` in order (0 where absent); a full-attention group
    stops before the first key no worker holds (no later key can be hit)."""
    if not full:
        return list(map(table.get, keys, repeat(0)))
    vals = list(map(table.get, keys))
    if None in vals:
        del vals[vals.index(None) :]
    return vals  # type: ignore[return-value]
