"""Read side of the in-process index: snapshots, matrices and bitsets for the scorer.

Split from ``router.index.memory`` (the write side and the layout's description): the
three read forms the scorer's paths use. ``fetch_bits`` hands out the tables themselves
(the fast path, ``router.score.bits``); ``fetch_columns`` and ``fetch`` unpack the
bitset fields into per-worker media bytes (numpy ``unpackbits``, in C) for the paths
that need them: EAGLE workers, workers at another hash unit, comparisons in tests.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import repeat
from typing import Any

import numpy as np
from numpy.typing import NDArray

from router.index.base import (
    Bits,
    BlockKey,
    Columns,
    IndexBackend,
    WorkerSnapshot,
)

# _PICK[bit][f]: bytes.translate table taking a byte to its bit ``bit`` as medium bit f.
_PICK = [[bytes(((b >> bit) & 1) << f for b in range(256)) for f in range(3)] for bit in range(8)]


class MemoryReads(IndexBackend):
    """``fetch``, ``fetch_columns`` and ``fetch_bits`` over ``MemoryIndex``'s tables."""

    _workers: dict[str, Any]
    _tables: dict[int, dict[BlockKey, int]]
    _nslots: int
    _stride: int

    def _matrix(self, g: int, keys: Sequence[BlockKey], full: bool) -> NDArray[np.uint8]:
        """(keys x slots) media bitmasks of group ``g``; a full-attention group stops at
        the first key no worker holds (zeros follow)."""
        ns = max(self._nslots, 1)
        out = np.zeros((len(keys), ns), dtype=np.uint8)
        t = self._tables.get(g)
        if not t or not keys:
            return out
        if full:
            vals = list(map(t.get, keys))
            if None in vals:
                del vals[vals.index(None) :]
        else:
            vals = list(map(t.get, keys, repeat(0)))
        if not vals:
            return out
        s, n = self._stride, len(vals)
        lo, nb = s // 8, (ns + 7) // 8  # field 1 starts at byte lo; nb bytes hold the slots
        if max(vals) >> (2 * s) == 0:  # nothing offloaded: the GPU field is the mask
            raw = b"".join(map(int.to_bytes, vals, repeat(s // 4), repeat("little")))
            rows = np.frombuffer(raw, dtype=np.uint8).reshape(n, s // 4)
            gpu = np.unpackbits(rows[:, lo : lo + nb], axis=1, bitorder="little")
            out[:n] = gpu[:, :ns]
            return out
        raw = b"".join(map(int.to_bytes, vals, repeat(s // 2), repeat("little")))
        rows = np.frombuffer(raw, dtype=np.uint8).reshape(n, s // 2)
        for f in (1, 2, 3):  # GPU, CPU, STORAGE bits of the slots only
            got = np.unpackbits(rows[:, f * lo : f * lo + nb], axis=1, bitorder="little")
            out[:n] |= got[:, :ns] << (f - 1)
        return out

    def _slot_bytes(
        self, g: int, keys: Sequence[BlockKey], full: bool, slots: list[int]
    ) -> dict[int, bytes]:
        """Per slot, the media byte of each key (``fetch``'s snapshots): every value's
        bytes joined once, then per slot a strided slice and a ``translate`` per field
        -- all in C, no numpy call per worker (the per-worker path serves small fleets,
        where a few fixed-cost calls are most of a score)."""
        t = self._tables.get(g)
        if not t or not keys:
            return dict.fromkeys(slots, b"")
        if full:
            vals = list(map(t.get, keys))
            if None in vals:
                del vals[vals.index(None) :]
        else:
            vals = list(map(t.get, keys, repeat(0)))
        if not vals:
            return dict.fromkeys(slots, b"")
        s, n = self._stride, len(vals)
        gpu_only = max(vals) >> (2 * s) == 0
        width = s // 4 if gpu_only else s // 2
        raw = b"".join(map(int.to_bytes, vals, repeat(width), repeat("little")))
        out: dict[int, bytes] = {}
        for slot in slots:
            byte, bit = divmod(slot, 8)
            pick = _PICK[bit]
            gpu = raw[s // 8 + byte :: width].translate(pick[0])
            if gpu_only:
                out[slot] = gpu
                continue
            cpu = raw[s // 4 + byte :: width].translate(pick[1])
            sto = raw[3 * s // 8 + byte :: width].translate(pick[2])
            media = int.from_bytes(gpu, "big") | int.from_bytes(cpu, "big")
            out[slot] = (media | int.from_bytes(sto, "big")).to_bytes(n, "big")
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
        return Bits(list(cohorts.values()), unknown, self._tables, self._stride)
