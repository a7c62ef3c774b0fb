"""The in-process index (default): one shared table per group index, a nibble per slot.

Layout, and why. ``tables[g]`` maps a block key to an int holding four bits per worker
slot ``s``: bit ``4s`` is set when that worker holds the key on some medium, bits
``4s+1``, ``4s+2``, ``4s+3`` when it holds it on GPU, CPU, STORAGE. So a score costs one
dict lookup per request block and group and one AND per block for every worker at once
(``router.score.bits``: the any-medium bits AND like a bitset of slots) -- not one
lookup per block *per worker* (measured: with 64 workers the per-worker layout spent
~8 ms of an 8k-token score in cache-missing lookups) -- and a worker's media bytes are
one strided slice of the values' bytes and a ``translate`` (a slot's four bits share a
byte). A key held by one worker alone stores one shared int per (slot, medium), so its
value costs nothing; workers sharing a prefix share its entries, and the keys of a
prefix held by the same workers share one int (a write op reuses the value it made for
the previous block with the same old value): one int per distinct holder set along a
chain, so bytes per entry stay flat as workers join (docs/benchmarks.md, round 5).

Per worker: ``maps[block_size]`` maps engine hash -> block key, shared by the groups of
one block size (they carry the same hashes). It doubles as the reverse structure: every
key the worker holds is in it, so clearing a worker walks its own keys only.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from router import native
from router.index.base import (
    BIT_MEDIA,
    GPU_BIT,
    ApplyResult,
    Bits,
    BlockKey,
    ClearOp,
    EngineHash,
    GroupMeta,
    Op,
    RemoveOp,
    SeqOp,
    StoreOp,
    WorkerState,
    seq_verdict,
)
from router.index.memory_loops import remove_loop, store_loop
from router.index.memory_read import MemoryReads
from router.index.memory_worker import GHOST_ENTRIES, add_ghosts
from router.index.memory_worker import Worker as _Worker

_BIT_SLOT = {1: 0, 2: 1, 4: 2}
_INT_BYTES = sys.getsizeof(2**63)


class MemoryIndex(MemoryReads):
    """Dict-based backend; every coroutine completes without awaiting anything."""

    kind = "memory"

    def __init__(self, ghost_entries: int = GHOST_ENTRIES) -> None:
        self._ghost_cap = ghost_entries
        self._workers: dict[str, _Worker] = {}
        self._tables: dict[int, dict[BlockKey, int]] = {}
        self._free: list[int] = []
        self._registrations: dict[str, bytes] = {}  # lives as long as this process
        self._nslots = 0
        self._gen = 0  # fetch_bits' cache key: bumped when a slot or metadata changes
        self._bits_cache: dict[tuple[str, ...], tuple[int, Bits]] = {}
        # (slot, medium field) -> the value of a key held by that slot alone, on that
        # medium: one shared int object instead of one per key.
        self._solo: dict[tuple[int, int], int] = {}
        self._layouts: dict[tuple[object, ...], int] = {}

    async def ping(self) -> bool:
        return True

    async def close(self) -> None:
        self._workers.clear()
        self._tables.clear()
        self._free.clear()
        self._solo.clear()
        self._nslots = 0
        self._gen += 1

    async def stats(self) -> dict[str, int | float | str]:
        entries = sum(sum(w.entries.values()) for w in self._workers.values())
        map_entries = sum(len(m) for w in self._workers.values() for m in w.maps.values())
        keys = sum(len(t) for t in self._tables.values())
        size = sum(sys.getsizeof(t) for t in self._tables.values())
        size += sum(sys.getsizeof(m) for w in self._workers.values() for m in w.maps.values())
        # Estimate: a key and a value int per table entry, an engine-hash int per map entry.
        # A shared key shares one value of up to 4 bits per slot; a solo value is shared.
        # The native maps hold keys and engine hashes as uint64 in their slots (counted
        # by ``getsizeof``): only the value ints are extra.
        if all(not isinstance(t, dict) for t in self._tables.values()):
            size += keys * _INT_BYTES
        else:
            size += keys * (_INT_BYTES + 8) + map_entries * _INT_BYTES
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
        return w.state.copy()

    def _worker(self, worker_id: str, state: WorkerState) -> _Worker:
        w = self._workers.get(worker_id)
        if w is None:
            if self._free:
                slot = self._free.pop()
            else:
                slot = self._nslots
                self._nslots += 1
            w = self._workers[worker_id] = _Worker(state, slot, self._layout(state))
            self._gen += 1
        return w

    def _solo_value(self, slot: int, field: int) -> int:
        got = self._solo.get((slot, field))
        if got is None:
            got = self._solo[(slot, field)] = (1 | 1 << field) << (4 * slot)
        return got

    def _layout(self, state: WorkerState) -> int:
        """A small int per distinct (groups, hash unit, settings): what scoring reads."""
        key = (tuple(sorted(state.groups.items())), state.hash_unit, state.settings)
        got = self._layouts.get(key)
        if got is None:
            got = self._layouts[key] = len(self._layouts)
        return got

    async def save_worker(self, worker_id: str, state: WorkerState) -> None:
        self._worker(worker_id, state).set_state(state, self._layout(state))
        self._gen += 1

    async def known_workers(self) -> list[str]:
        return sorted(self._workers)

    async def resolve(
        self,
        worker_id: str,
        block_size: int,
        hashes: Sequence[EngineHash],
        *,
        live_only: bool = False,
    ) -> list[BlockKey | None]:
        w = self._workers.get(worker_id)
        emap = w.maps.get(block_size) if w is not None else None
        out: list[BlockKey | None] = list(map(emap.get, hashes)) if emap else [None] * len(hashes)
        ghosts = w.ghosts.get(block_size) if w is not None and not live_only else None
        if ghosts and None in out:
            new, old = ghosts
            out = [
                k if k is not None else new.get(h, old.get(h))
                for h, k in zip(hashes, out, strict=True)
            ]
        return out

    async def apply(
        self, worker_id: str, groups: dict[int, GroupMeta], ops: Sequence[Op]
    ) -> ApplyResult:
        w = self._workers.get(worker_id) or self._worker(worker_id, WorkerState(dict(groups)))
        if w.state.groups != groups:
            state = w.state.copy(groups)
            w.set_state(state, self._layout(state))
            self._gen += 1
        copies = w.copies
        anyb = 1 << (4 * w.slot)  # held on some medium
        res = ApplyResult()
        skip = False
        fast = w.fast
        for op in ops:
            if type(op) is StoreOp and not skip and (hit := fast.get((op.group, op.medium_bit))):
                store, emap, counts, i, pos, fpos, bits, solo = hit
                new, fresh, again = store(emap, op.hashes, op.keys, pos, fpos, bits, solo)
                for k in again:  # another physical copy of a block already held
                    c = (op.group, op.medium_bit, k)
                    copies[c] = copies.get(c, 0) + 1
                res.stored += new
                res.stored_repeat += len(op.hashes) - new
                counts[i] += new
                w.entries[op.group] = w.entries.get(op.group, 0) + fresh
                continue
            if (
                type(op) is RemoveOp
                and not skip
                and not copies
                and (hit := w.fast_remove.get((op.group, op.medium_bit)))
            ):
                remove, emap, counts, i, pos, fpos, bits, anyb, siblings, bs = hit
                got = remove(emap, op.hashes, pos, fpos, bits, anyb, siblings)
                if got is not None:  # else the general loop below (no change made)
                    self._removed(w, res, counts, i, op, bs, got)
                    continue
            if isinstance(op, SeqOp):
                last = w.seqs.get(op.rank)
                verdict = seq_verdict(None if last is None else last[0], op)
                skip = verdict != 1
                if verdict == 1:
                    w.seqs[op.rank] = (op.seq, op.fingerprint)
                elif verdict == 0:
                    res.skipped_batches += 1
                else:
                    res.deferred_batches += 1
                    res.deferred_at = -1 if last is None else last[0]
                continue
            if skip:
                continue
            if isinstance(op, ClearOp):
                self._clear(w)
                continue
            g = op.group
            bs = groups[g].block_size
            t = self._tables.get(g)
            if t is None:
                t = self._tables[g] = native.new_table()
            emap = w.maps.get(bs)
            if emap is None:
                emap = w.maps[bs] = native.new_hash_map()
            counts = w.counts.get(g)
            if counts is None:
                counts = w.counts[g] = [0, 0, 0]
            field = _BIT_SLOT[op.medium_bit] + 1
            b = anyb << field
            if isinstance(op, StoreOp):
                bit = op.medium_bit
                solo = self._solo_value(w.slot, field)
                store = None if isinstance(t, dict) else getattr(t, "store", None)
                if store is not None:  # router.native.U64Map: the same loop in C
                    pos = 4 * w.slot
                    i = _BIT_SLOT[bit]
                    fast[(g, bit)] = (store, emap, counts, i, pos, pos + field, b | anyb, solo)
                    new, fresh, again = store(
                        emap, op.hashes, op.keys, pos, pos + field, b | anyb, solo
                    )
                else:
                    new, fresh, again = store_loop(t, emap, op, b, anyb, solo)
                for k in again:  # another physical copy of a block already held
                    c = (g, bit, k)
                    copies[c] = copies.get(c, 0) + 1
                res.stored += new
                res.stored_repeat += len(op.hashes) - new
                counts[_BIT_SLOT[bit]] += new
                w.entries[g] = w.entries.get(g, 0) + fresh
                continue
            sib_gs = [g2 for g2, m2 in groups.items() if g2 != g and m2.block_size == bs]
            siblings = [self._tables.get(g2, {}) for g2 in sib_gs]
            bit = op.medium_bit
            remove = None if copies or isinstance(t, dict) else getattr(t, "remove", None)
            got = remove and remove(
                emap, op.hashes, 4 * w.slot, 4 * w.slot + field, b, anyb, siblings
            )
            if got is not None:  # router.native.U64Map: the loop below in C (no extra copies)
                if all(g2 in self._tables for g2 in sib_gs):  # no stand-in: cache the call
                    w.fast_remove[(g, bit)] = (
                        remove, emap, counts, _BIT_SLOT[bit], 4 * w.slot,
                        4 * w.slot + field, b, anyb, siblings, bs,
                    )  # fmt: skip
                self._removed(w, res, counts, _BIT_SLOT[bit], op, bs, got)
                continue
            new, fresh, dropped, gone = remove_loop(t, emap, op, b, anyb, copies, siblings)
            self._removed(w, res, counts, _BIT_SLOT[bit], op, bs, (new, fresh, gone), dropped)
        return res

    def _removed(
        self,
        w: _Worker,
        res: ApplyResult,
        counts: list[int],
        i: int,
        op: RemoveOp,
        bs: int,
        got: tuple[int, int, list[tuple[EngineHash, BlockKey]]],
        dropped: int = 0,
    ) -> None:
        """Account for a removal (``U64Map.remove``'s answer, or ``remove_loop``'s: blocks
        removed, keys the worker no longer holds, mappings gone to the ghosts; extra
        copies dropped while their blocks stay)."""
        new, fresh, gone = got
        if gone:
            add_ghosts(w, bs, gone, self._ghost_cap)
        res.removed += new
        res.removed_missing += len(op.hashes) - new
        counts[i] -= new - dropped
        w.entries[op.group] = w.entries.get(op.group, 0) - fresh

    def _clear(self, w: _Worker) -> None:
        """Drop the worker's bits; its maps name every key it holds (whatever the block
        size a group had when the key was stored)."""
        keep = ~(0xF << (4 * w.slot))
        keys = {k for emap in w.maps.values() for k in emap.values()}
        seen: dict[int, int] = {}  # equal holder sets keep sharing one int (by value)
        for g, held in w.entries.items():
            t = self._tables.get(g)
            if not held or t is None:
                continue
            for k in keys:
                v = t.get(k)
                if v is not None:
                    got = seen.get(v)
                    if got is None:
                        got = seen[v] = v & keep
                    v = got
                    if v:
                        t[k] = v
                    else:
                        del t[k]
        w.maps.clear()
        w.fast.clear()
        w.fast_remove.clear()
        w.ghosts.clear()
        w.counts.clear()
        w.entries.clear()
        w.copies.clear()

    async def clear_worker(self, worker_id: str) -> None:
        w = self._workers.get(worker_id)
        if w is not None:
            self._clear(w)
            w.seqs.clear()

    async def save_registration(self, worker_id: str, spec: bytes) -> None:
        self._registrations[worker_id] = spec

    async def delete_registration(self, worker_id: str) -> None:
        self._registrations.pop(worker_id, None)

    async def load_registrations(self) -> dict[str, bytes]:
        return dict(self._registrations)

    async def load_seqs(self, worker_id: str) -> dict[int, tuple[int, int]]:
        w = self._workers.get(worker_id)
        return dict(w.seqs) if w is not None else {}

    async def remove_worker(self, worker_id: str) -> None:
        w = self._workers.pop(worker_id, None)
        if w is not None:
            self._gen += 1
            self._clear(w)
            self._free.append(w.slot)

    async def copies(
        self, worker_id: str, group: int, keys: Sequence[BlockKey], medium_bit: int = GPU_BIT
    ) -> list[int]:
        w = self._workers.get(worker_id)
        t = self._tables.get(group)
        if w is None or not t:
            return [0] * len(keys)
        bit, extra = 1 << (4 * w.slot + _BIT_SLOT[medium_bit] + 1), w.copies
        return [1 + extra.get((group, medium_bit, k), 0) if t.get(k, 0) & bit else 0 for k in keys]

    async def group_counts(self, worker_id: str) -> dict[int, dict[str, int]]:
        w = self._workers.get(worker_id)
        if w is None:
            return {}
        return {
            g: {medium: c[_BIT_SLOT[bit]] for bit, medium in BIT_MEDIA if c[_BIT_SLOT[bit]]}
            for g, c in sorted(w.counts.items())
        }
