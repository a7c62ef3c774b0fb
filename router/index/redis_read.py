"""Read side of the Redis index: one script call per score, one packed answer.

Why: with the inverted layout (``router.index.redis_lua``) a score reads one field per
request block and group -- the block's holders -- whatever the worker count, and the
answer is a few strings the client unpacks with numpy into the (blocks x slots)
matrices the all-workers scorer reads (``router.score.vec``). The per-worker snapshots
(``fetch``) are columns of the same matrices.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec
import numpy as np
from numpy.typing import NDArray

from router.index.base import BlockKey, Columns, WorkerSnapshot
from router.index.redis_codec import State, key_blob, state_dec

# KEYS[1] = X..'state' (routes the call; every key shares its tag). ARGV[1] = X,
# ARGV[2] = the metadata version the client holds the workers' metadata at ("-": none),
# ARGV[3] = the worker ids (one msgpack array), ARGV[4] = the tables to read as the
# client derived them from that metadata ("bounded;g,bs,all_full,any_full;..."), then
# pairs (block size, concatenated 8-byte keys). When the version is current the ids and
# plans are not read; otherwise the tables are derived from the workers' plans.
# Returns {version, states, slots, g1, bs1, n1, rows1, g2, ...}: the
# workers' metadata and slots (false when unknown) -- or false twice when the client's
# version is current (``X..'ver'`` grows with every metadata or slot change) -- then per
# (group, block size) some requested worker has, the number of blocks read and their
# holders strings joined by NUL (no holders byte is 0; a block nobody holds is empty;
# a block held exactly like the one before is the single byte 1 -- no holders string
# has length 1 -- so a prefix every worker holds costs one string, not one per block).
# A table only full-attention workers read stops before the first block no worker
# holds; the other tables stop at the longest full-attention prefix any table allows
# (when every worker has one): no worker's hit can reach past it. HMGETs grow
# geometrically (32 ... 512 fields) so a short prefix stops early. ``no-writes`` lets
# replicas serve it.
FETCH = r"""#!lua flags=no-writes
local X = ARGV[1]
local ver = redis.call('GET', X .. 'ver') or '0'
local fields = {}
for a = 5, #ARGV, 2 do
  local blob = ARGV[a + 1]
  local t = {}
  for j = 0, #blob / 8 - 1 do t[j + 1] = string.sub(blob, j * 8 + 1, j * 8 + 8) end
  fields[ARGV[a]] = t
end
local tabs, order = {}, {}
local bounded = true
local states, slots = false, false
if ver == ARGV[2] then
  bounded = string.sub(ARGV[4], 1, 1) == '1'
  for g, bs, all, any in string.gmatch(ARGV[4], '(-?%d+),(%d+),(%d),(%d)') do
    local t = g .. ',' .. bs
    order[#order + 1] = {g, bs, t}
    tabs[t] = {all == '1', any == '1'}
  end
else
  local ids = cmsgpack.unpack(ARGV[3])
  local N = #ids
  if N > 0 then
    states = redis.call('HMGET', KEYS[1], unpack(ids))
    slots = redis.call('HMGET', X .. 'slot', unpack(ids))
    local plans = redis.call('HMGET', X .. 'plan', unpack(ids))
    for w = 1, N do
      local plan = plans[w]
      if plan then
        local has_full = false
        for g, bs, full in string.gmatch(plan, '(-?%d+),(%d+),(%d)') do
          if fields[bs] then
            local t = g .. ',' .. bs
            local f = full == '1'
            if tabs[t] == nil then
              order[#order + 1] = {g, bs, t}
              tabs[t] = {f, f}
            else
              tabs[t] = {tabs[t][1] and f, tabs[t][2] or f}
            end
            if f then has_full = true end
          end
        end
        if not has_full then bounded = false end
      end
    end
  else
    states, slots = {}, {}
  end
end
local out = {ver, states, slots}
local bound = -1
local function read(g, bs, stop_at_miss, n)
  local fs = fields[bs]
  local XG = X .. 'x:' .. g
  local parts = {}
  local start, chunk, miss, nread = 0, 32, -1, 0
  local prev = nil
  while start < n do
    local cnt = math.min(chunk, n - start)
    local vals = redis.call('HMGET', XG, unpack(fs, start + 1, start + cnt))
    local take = cnt
    for j = 1, cnt do
      local v = vals[j]
      if not v then
        if miss < 0 then miss = start + j - 1 end
        if stop_at_miss then
          take = j - 1
          break
        end
        v = ''
      end
      -- Lua strings are interned: equality is a pointer test, and a repeated row
      -- (a shared prefix: every holder holds both blocks alike) goes as one byte.
      if v == prev then vals[j] = '\1' else vals[j] = v; prev = v end
    end
    if take > 0 then parts[#parts + 1] = table.concat(vals, '\0', 1, take) end
    nread = nread + take
    if take < cnt then break end
    start = start + cnt
    if chunk < 512 then chunk = chunk * 2 end
  end
  out[#out + 1] = g
  out[#out + 1] = bs
  out[#out + 1] = nread
  out[#out + 1] = table.concat(parts, '\0')
  if miss < 0 then miss = nread end
  return miss
end
-- Tables some worker reads as full attention first: they bound the others.
for _, e in ipairs(order) do
  local t = tabs[e[3]]
  if t[2] then
    local reach = read(e[1], e[2], t[1], #fields[e[2]]) * tonumber(e[2])
    if reach > bound then bound = reach end
  end
end
for _, e in ipairs(order) do
  if not tabs[e[3]][2] then
    local n = #fields[e[2]]
    if bounded and bound >= 0 then n = math.min(n, math.floor(bound / tonumber(e[2]))) end
    read(e[1], e[2], false, n)
  end
end
return out
"""


class View:
    """The requested workers as the cached metadata describes them (memoized per
    request shape while the metadata version holds)."""

    __slots__ = ("cohorts", "packed_ids", "slots", "snaps", "spec", "unknown", "width")

    def __init__(self, ids: list[str], sizes: frozenset[int], entries: dict[str, Any]) -> None:
        self.packed_ids = msgspec.msgpack.encode(ids)
        self.snaps: dict[str, WorkerSnapshot | None] = {}
        self.slots: dict[str, int] = {}
        cohorts: dict[bytes, tuple[WorkerSnapshot, list[str]]] = {}
        self.unknown: list[str] = []
        tabs: dict[tuple[int, int], tuple[bool, bool]] = {}
        bounded = True
        for w in ids:
            entry = entries[w]
            if entry is None:
                self.snaps[w] = None
                self.unknown.append(w)
                continue
            blob, snap, slot = entry
            self.snaps[w] = snap
            self.slots[w] = slot
            cohorts.setdefault(blob, (snap, []))[1].append(w)
            has_full = False
            for g, m in snap.groups.items():
                if m.block_size in sizes:
                    f = m.rule == "full"
                    a, b = tabs.get((g, m.block_size), (f, f))
                    tabs[(g, m.block_size)] = (a and f, b or f)
                    has_full = has_full or f
            bounded = bounded and has_full
        self.cohorts = list(cohorts.values())
        # Workers without a slot (never stored anything) read an all-zero column.
        self.width = max(self.slots.values(), default=-1) + 2
        for w, s in self.slots.items():
            if s < 0:
                self.slots[w] = self.width - 1
        items = (f"{g},{bs},{int(a)},{int(b)}" for (g, bs), (a, b) in tabs.items())
        self.spec = ";".join([str(int(bounded)), *items])


class MetaCache:
    """The workers' metadata and slots as of one metadata version: while it is current,
    a score sends no worker ids and its answer carries no metadata."""

    def __init__(self) -> None:
        self.version = b"-"  # never a server's version ("0" before the first change)
        self.entries: dict[str, tuple[bytes, WorkerSnapshot, int] | None] = {}
        self.states: dict[bytes, WorkerSnapshot] = {}  # decoded, by blob
        self._views: dict[tuple[tuple[str, ...], frozenset[int]], View] = {}

    def view(self, ids: list[str], sizes: frozenset[int]) -> View | None:
        """The view of ``ids`` under the cached version (None: some worker is not cached)."""
        key = (tuple(ids), sizes)
        v = self._views.get(key)
        if v is None:
            e = self.entries
            if not all(w in e for w in ids):
                return None
            if len(self._views) >= 256:
                self._views.clear()
            v = self._views[key] = View(ids, sizes, e)
        return v

    def update(self, version: bytes, ids: list[str], states: list[Any], slots: list[Any]) -> None:
        if version != self.version or len(self.entries) > 65_536:
            self.entries = {}
            self._views = {}
            self.version = version
        if len(self.states) >= 4096:  # layouts are few; never grow unbounded
            self.states.clear()
        for w, blob, slot in zip(ids, states, slots, strict=True):
            if blob is None:
                self.entries[w] = None
                continue
            blob = bytes(blob)
            snap = self.states.get(blob)
            if snap is None:
                st: State = state_dec.decode(blob)
                snap = self.states[blob] = WorkerSnapshot(
                    dict(st.groups), {}, st.hash_unit, st.settings
                )
            # A worker that never stored anything has no slot yet (-1).
            self.entries[w] = (blob, snap, int(slot) if slot is not None else -1)
        self._views = {k: v for k, v in self._views.items() if not set(k[0]) & set(ids)}


Mats = dict[tuple[int, int], NDArray[np.uint8]]


def decode(
    ids: list[str], keys_by_size: dict[int, Sequence[BlockKey]], got: list[Any], meta: MetaCache
) -> tuple[View, Mats] | None:
    """A ``FETCH`` answer as the view it was read under and one matrix per table (None:
    the answer relied on cached metadata that a concurrent call replaced; ask again)."""
    sizes = frozenset(keys_by_size)
    if got[1] is not None:
        meta.update(bytes(got[0]), ids, got[1], got[2])
    elif bytes(got[0]) != meta.version:
        return None
    view = meta.view(ids, sizes)
    if view is None:
        return None
    mats = {}
    for a in range(3, len(got), 4):
        g, bs, nread = int(got[a]), int(got[a + 1]), int(got[a + 2])
        mats[(g, bs)] = _matrix(len(keys_by_size[bs]), view.width, nread, bytes(got[a + 3]))
    return view, mats


def columns(view: View, mats: Mats) -> Columns:
    return Columns(view.cohorts, view.unknown, view.slots, mats, view.width)


def snapshots(view: View, mats: Mats) -> dict[str, WorkerSnapshot | None]:
    """Per worker, the media byte of each block, truncated as ``WorkerSnapshot``
    documents (full-attention groups first: their prefix bounds the others)."""
    out: dict[str, WorkerSnapshot | None] = {}
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
    return out


def _matrix(n: int, width: int, nread: int, rows: bytes) -> NDArray[np.uint8]:
    """(n x width) media masks from one table's NUL-joined holders strings (rows past
    what the script read stay zero; holders at slots >= width were not asked about; a
    row b"\\x01" repeats the one before)."""
    out = np.zeros((n, width), dtype=np.uint8)
    if not nread or not rows:
        return out
    raw = np.frombuffer(rows, dtype=np.uint8)
    sep = raw == 0
    row_of = np.cumsum(sep)
    lens = np.bincount(row_of[~sep], minlength=nread)
    again = lens == 1
    keep = ~sep
    if again.any():
        keep &= ~again[row_of]
    trip = raw[keep].reshape(-1, 3)
    row = row_of[keep][0::3]
    slot = (trip[:, 0].astype(np.int64) - 8) * 248 + (trip[:, 1].astype(np.int64) - 8)
    ok = slot < width
    out[row[ok], slot[ok]] = trip[ok, 2]
    if again.any():
        src = np.maximum.accumulate(np.where(again, 0, np.arange(nread)))
        out[:nread] = out[src]
    return out


def fetch_args(
    prefix: str,
    ids: list[str],
    keys_by_size: dict[int, Sequence[BlockKey]],
    meta: MetaCache | None,
) -> list[Any]:
    """``FETCH``'s ARGV: the cached version and tables when every worker is cached
    (``meta`` None: ask for the metadata)."""
    view = meta.view(ids, frozenset(keys_by_size)) if meta is not None else None
    args: list[Any] = [prefix]
    if view is None:
        args += [b"-", msgspec.msgpack.encode(ids), b""]
    else:  # the ids too: the version may have moved since
        args += [meta.version, view.packed_ids, view.spec]  # type: ignore[union-attr]
    for bs, keys in keys_by_size.items():
        args += [bs, key_blob(keys)]
    return args


__all__ = ["FETCH", "Mats", "MetaCache", "View", "columns", "decode", "fetch_args", "snapshots"]
