"""Read side of the Redis index: one script call per score, one packed answer.

Why: with the inverted layout (``router.index.redis_lua``) a score reads one field per
request block and group -- the block's holders -- whatever the worker count, and the
answer is a few strings the client unpacks with numpy into the (blocks x slots)
matrices the all-workers scorer reads (``router.score.vec``). The per-worker snapshots
(``fetch``) are columns of the same matrices.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import msgspec
import numpy as np
from numpy.typing import NDArray

from router.index.base import GPU_BIT, BlockKey, Columns, IndexBackend, WorkerSnapshot
from router.index.redis_codec import ROW_KEY_BYTES, index_prefix, row_blob, shard_of
from router.index.redis_lua_read import FETCH
from router.index.redis_meta import MetaCache, View

_T = TypeVar("_T")


Mats = dict[tuple[int, int], NDArray[np.uint8]]


Part = tuple[list[str], MetaCache]  # one shard's workers asked about, and its cache


def decode(
    parts: list[Part], keys_by_size: dict[int, Sequence[BlockKey]], got: list[Any]
) -> list[tuple[View, Mats]] | None:
    """A ``FETCH`` answer as, per shard, the view it was read under and one matrix per
    table (None: an answer relied on cached metadata that a concurrent call replaced;
    ask again)."""
    sizes = frozenset(keys_by_size)
    out: list[tuple[View, Mats]] = []
    pos = 0
    stale = False
    for ids, meta in parts:
        version, states, slots, ntab = got[pos : pos + 4]
        tables = got[pos + 4 : pos + 4 + 4 * int(ntab)]
        pos += 4 + 4 * int(ntab)
        if states is not None:
            meta.update(bytes(version), ids, states, slots)
        elif bytes(version) != meta.version:
            stale = True
            continue
        view = meta.view(ids, sizes)
        if view is None:
            stale = True
            continue
        mats = {}
        for a in range(0, len(tables), 4):
            g, bs, nread = int(tables[a]), int(tables[a + 1]), int(tables[a + 2])
            n = len(keys_by_size[bs])
            mats[(g, bs)] = _matrix(n, view.width, nread, bytes(tables[a + 3]))
            # The last column stands for workers without a slot: it holds nothing, even
            # where a worker not asked about has that slot number.
            mats[(g, bs)][:, -1] = 0
        out.append((view, mats))
    return None if stale else out


def columns(
    results: list[tuple[View, Mats]], keys_by_size: dict[int, Sequence[BlockKey]]
) -> Columns:
    """One ``Columns`` over every shard's workers: each shard's slots after the ones
    before it, cohorts of equal metadata merged across shards."""
    if len(results) == 1:
        view, mats = results[0]
        return Columns(view.cohorts, view.unknown, view.slots, mats, view.width)
    cohorts: dict[bytes, tuple[WorkerSnapshot, list[str]]] = {}
    unknown: list[str] = []
    slots: dict[str, int] = {}
    tables = {t for _, mats in results for t in mats}
    parts: dict[tuple[int, int], list[NDArray[np.uint8]]] = {t: [] for t in tables}
    offset = 0
    for view, mats in results:
        for blob, (snap, ws) in view.by_blob.items():
            cohorts.setdefault(blob, (snap, []))[1].extend(ws)
        unknown += view.unknown
        for w, s in view.slots.items():
            slots[w] = offset + s
        for t in tables:
            m = mats.get(t)
            if m is None:
                m = np.zeros((len(keys_by_size[t[1]]), view.width), dtype=np.uint8)
            parts[t].append(m)
        offset += view.width
    merged = {t: np.hstack(ms) for t, ms in parts.items()}
    return Columns(list(cohorts.values()), unknown, slots, merged, offset)


def snapshots(results: list[tuple[View, Mats]]) -> dict[str, WorkerSnapshot | None]:
    """Per worker, the media byte of each block, truncated as ``WorkerSnapshot``
    documents (full-attention groups first: their prefix bounds the others)."""
    out: dict[str, WorkerSnapshot | None] = {}
    for view, mats in results:
        _snapshots(view, mats, out)
    return out


def _snapshots(view: View, mats: Mats, out: dict[str, WorkerSnapshot | None]) -> None:
    for w, snap in view.snaps.items():
        if snap is None:
            out[w] = None
            continue
        s = view.slots[w]
        masks: dict[int, bytes] = {}
        order = sorted(snap.groups.items(), key=lambda kv: (kv[1].rule != "full", kv[0]))
        bound = -1
        for g, meta in order:
            mat = mats.get((g, meta.block_size))
            if mat is None:
                continue
            col = mat[:, s].tobytes()
            if meta.rule == "full":
                z = col.find(0)
                got = col if z < 0 else col[:z]
                reach = len(got) * meta.block_size
                bound = reach if bound < 0 else min(bound, reach)
            else:
                if bound >= 0:
                    col = col[: bound // meta.block_size]
                got = col.rstrip(b"\0")
            masks[g] = got
        out[w] = WorkerSnapshot(dict(snap.groups), masks, snap.hash_unit, snap.settings)


def _matrix(n: int, width: int, nread: int, rows: bytes) -> NDArray[np.uint8]:
    """(n x width) media masks from one table's NUL-joined holders strings (rows past
    what the script read stay zero; holders at slots >= width were not asked about; a
    row b"\\x01" repeats the one before). Vectorized over holders, not bytes: the row
    bounds come from the NULs, then every holder's position from its row's start (six
    times faster at 256 workers than a pass over every byte)."""
    out = np.zeros((n, width), dtype=np.uint8)
    if not nread or not rows:
        return out
    raw = np.frombuffer(rows, dtype=np.uint8)
    ends = np.flatnonzero(raw == 0)
    starts = np.empty(nread, dtype=np.int64)
    starts[0] = 0
    starts[1:] = ends + 1
    lens = np.empty(nread, dtype=np.int64)
    lens[:-1] = ends - starts[:-1]
    lens[-1] = len(raw) - starts[-1]
    again = lens == 1
    holders = lens // 3
    holders[again] = 0
    total = int(holders.sum())
    if total:
        first = np.cumsum(holders) - holders  # each row's first holder, counted over rows
        pos = np.repeat(starts - 3 * first, holders) + 3 * np.arange(total)
        cell = np.repeat(np.arange(nread) * width, holders)
        # code(slot) = (8 + slot // 248, 8 + slot % 248)
        slot = raw[pos].astype(np.int64) * 248 + raw[pos + 1] - 8 * 249
        ok = slot < width
        if not ok.all():
            pos, cell, slot = pos[ok], cell[ok], slot[ok]
        out.ravel()[cell + slot] = raw[pos + 2]
    if again.any():
        src = np.maximum.accumulate(np.where(again, 0, np.arange(nread)))
        out[:nread] = out[src]
    return out


def fetch_args(
    parts: Sequence[tuple[str, list[str], MetaCache | None]],
    keys_by_size: dict[int, Sequence[BlockKey]],
) -> list[Any]:
    """``FETCH``'s ARGV for shards given as (prefix, ids, cache): the cached version and
    tables where every worker is cached (cache None: ask for the metadata)."""
    sizes = frozenset(keys_by_size)
    args: list[Any] = [len(parts)]
    for prefix, ids, meta in parts:
        view = meta.view(ids, sizes) if meta is not None else None
        if meta is None or view is None:
            args += [prefix, b"-", msgspec.msgpack.encode(ids), b""]
        else:  # the ids too: the version may have moved since
            args += [prefix, meta.version, view.packed_ids, view.spec]
    for bs, keys in keys_by_size.items():
        args += [bs, row_blob(keys)]
    return args


class RedisReads(IndexBackend):
    """``fetch``, ``fetch_columns`` and ``copies`` of ``RedisIndex`` (split from it):
    one ``FETCH`` per node, unpacked by the functions above."""

    _r: Any
    cluster: bool
    shards: int
    _meta: list[MetaCache]
    _shard_memo: dict[tuple[str, ...], dict[int, list[str]]]

    async def _eval(self, name: str, keys: list[str], args: list[Any]) -> Any:
        raise NotImplementedError

    async def _call(self, fn: Callable[[], Awaitable[_T]]) -> _T:
        raise NotImplementedError

    def _x(self, worker_id: str) -> str:
        raise NotImplementedError

    def _prefix(self, worker_id: str) -> str:
        raise NotImplementedError

    async def copies(
        self, worker_id: str, group: int, keys: Sequence[BlockKey], medium_bit: int = GPU_BIT
    ) -> list[int]:
        if not keys:
            return []
        prefix = self._prefix(worker_id)
        x = self._x(worker_id)
        fields = [k.to_bytes(8, "big") for k in keys]
        tag = bytes([medium_bit])

        async def run() -> list[Any]:
            pipe = self._r.pipeline(transaction=False)
            pipe.hget(x + "slot", worker_id)
            pipe.hmget(f"{x}x:{group}", [f[-ROW_KEY_BYTES:] for f in fields])
            pipe.hmget(f"{prefix}c:{group}", [f + tag for f in fields])
            return await pipe.execute()

        slot, rows, extra = await self._call(run)
        if slot is None:
            return [0] * len(keys)
        masks = [_mask_in(r, int(slot)) for r in rows]
        return [1 + int(e or 0) if m & medium_bit else 0 for m, e in zip(masks, extra, strict=True)]

    def _by_shard(self, worker_ids: Sequence[str]) -> dict[int, list[str]]:
        """The asked-about workers per shard (memoized per request: no per-worker
        Python on the hot path once a fleet's list has been seen)."""
        if self.shards == 1:
            return {0: list(dict.fromkeys(worker_ids))}
        memo = self._shard_memo
        key = tuple(worker_ids)
        got = memo.get(key)
        if got is None:
            got = {}
            for w in dict.fromkeys(worker_ids):
                got.setdefault(shard_of(w, self.shards), []).append(w)
            if len(memo) >= 256:
                memo.clear()
            memo[key] = got
        return got

    async def _fetch(
        self, worker_ids: Sequence[str], keys_by_size: dict[int, Sequence[BlockKey]]
    ) -> list[tuple[View, Mats]]:
        """One ``FETCH`` per node (one call in all on a single server; calls to several
        nodes run concurrently), each reading the shards of the asked-about workers it
        serves."""
        by_shard = self._by_shard(worker_ids)
        calls: dict[str, list[int]] = {}
        if self.cluster:  # the slot map (a no-op once the client has it)
            await self._call(self._r.initialize)
        for sh in sorted(by_shard):
            node = ""
            if self.cluster:
                node = self._r.get_node_from_key(index_prefix(sh) + "state").name
            calls.setdefault(node, []).append(sh)

        async def call(shards: list[int]) -> list[tuple[View, Mats]]:
            parts = [(by_shard[sh], self._meta[sh]) for sh in shards]
            key = index_prefix(shards[0]) + "state"
            plan: list[tuple[str, list[str], MetaCache | None]] = [
                (index_prefix(sh), by_shard[sh], self._meta[sh]) for sh in shards
            ]
            got = await self._eval("FETCH", [key], fetch_args(plan, keys_by_size))
            out = decode(
                parts,
                keys_by_size,
                got,
            )
            if out is None:  # a concurrent call replaced cached metadata: ask afresh
                plan = [(index_prefix(sh), by_shard[sh], None) for sh in shards]
                got = await self._eval("FETCH", [key], fetch_args(plan, keys_by_size))
                out = decode(parts, keys_by_size, got)
            assert out is not None  # an answer with metadata always decodes
            return out

        if len(calls) == 1:
            return await call(next(iter(calls.values())))
        got = await asyncio.gather(*(call(shards) for shards in calls.values()))
        return [r for rs in got for r in rs]

    async def fetch(
        self, worker_ids: Sequence[str], keys_by_size: dict[int, Sequence[BlockKey]]
    ) -> dict[str, WorkerSnapshot | None]:
        if not worker_ids:
            return {}
        snaps = snapshots(await self._fetch(worker_ids, keys_by_size))
        return {w: snaps[w] for w in dict.fromkeys(worker_ids)}

    async def fetch_columns(
        self, worker_ids: Sequence[str], keys_by_size: dict[int, Sequence[BlockKey]]
    ) -> Columns | None:
        if not worker_ids:
            return None
        return columns(await self._fetch(worker_ids, keys_by_size), keys_by_size)


def _mask_in(row: bytes | None, slot: int) -> int:
    """A worker's media mask in a holders string (``router.index.redis_lua``)."""
    if not row:
        return 0
    code = bytes((8 + slot // 248, 8 + slot % 248))
    p = row.find(code)
    return row[p + 2] if p >= 0 else 0


__all__ = [
    "FETCH",
    "Mats",
    "MetaCache",
    "Part",
    "RedisReads",
    "View",
    "columns",
    "decode",
    "fetch_args",
    "snapshots",
]
