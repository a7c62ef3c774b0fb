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

import numpy as np
from numpy.typing import NDArray

from router.index.base import BlockKey, Columns, WorkerSnapshot
from router.index.redis_codec import State, key_blob, state_dec

# KEYS[1] = X..'state' (routes the call; every key shares its tag). ARGV[1] = X,
# ARGV[2] = N, ARGV[3..N+2] = worker ids, then pairs (block size, concatenated 8-byte
# keys). Returns {states, slots, g1, bs1, lens1, rows1, g2, ...}: the workers' metadata
# and slots (false when unknown), then per (group, block size) some requested worker
# has, ``lens`` (2 bytes big-endian per block read: its holders string's length) and
# ``rows`` (the holders strings, concatenated). A table only full-attention workers
# read stops after the first block no worker holds; the other tables stop at the
# longest full-attention prefix any table allows (when every worker has one): no
# worker's hit can reach past it. HMGETs grow geometrically (32 ... 512 fields) so a
# short prefix stops early. ``no-writes`` lets replicas serve it.
FETCH = r"""#!lua flags=no-writes
local X = ARGV[1]
local N = tonumber(ARGV[2])
local ids = {}
for w = 1, N do ids[w] = ARGV[w + 2] end
local states = redis.call('HMGET', KEYS[1], unpack(ids))
local plans = redis.call('HMGET', X .. 'plan', unpack(ids))
local slots = redis.call('HMGET', X .. 'slot', unpack(ids))
local fields = {}
for a = N + 3, #ARGV, 2 do
  local blob = ARGV[a + 1]
  local t = {}
  for j = 0, #blob / 8 - 1 do t[j + 1] = string.sub(blob, j * 8 + 1, j * 8 + 8) end
  fields[ARGV[a]] = t
end
local tabs, order = {}, {}
local bounded = true
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
local out = {states, slots}
local bound = -1
local function read(g, bs, stop_at_miss, n)
  local fs = fields[bs]
  local XG = X .. 'x:' .. g
  local lens, rows = {}, {}
  local start, chunk, miss = 0, 32, -1
  while start < n do
    local cnt = math.min(chunk, n - start)
    local vals = redis.call('HMGET', XG, unpack(fs, start + 1, start + cnt))
    for j = 1, cnt do
      local v = vals[j]
      if v then
        lens[#lens + 1] = string.char(math.floor(#v / 256), #v % 256)
        rows[#rows + 1] = v
      else
        if miss < 0 then miss = start + j - 1 end
        if stop_at_miss then break end
        lens[#lens + 1] = '\0\0'
      end
    end
    if stop_at_miss and miss >= 0 then break end
    start = start + cnt
    if chunk < 512 then chunk = chunk * 2 end
  end
  out[#out + 1] = g
  out[#out + 1] = bs
  out[#out + 1] = table.concat(lens)
  out[#out + 1] = table.concat(rows)
  if miss < 0 then miss = #lens end
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


class Reply:
    """One ``FETCH`` answer, unpacked: metadata per worker, matrices per table."""

    __slots__ = ("matrices", "slots", "snaps", "width")

    def __init__(
        self,
        ids: list[str],
        keys_by_size: dict[int, Sequence[BlockKey]],
        got: list[Any],
        states: dict[bytes, WorkerSnapshot],
    ) -> None:
        self.snaps: dict[str, tuple[bytes, WorkerSnapshot] | None] = {}
        self.slots: dict[str, int] = {}
        for w, blob, slot in zip(ids, got[0], got[1], strict=True):
            if blob is None:
                self.snaps[w] = None
                continue
            blob = bytes(blob)
            snap = states.get(blob)
            if snap is None:
                if len(states) >= 4096:  # layouts are few; never grow unbounded
                    states.clear()
                st: State = state_dec.decode(blob)
                snap = states[blob] = WorkerSnapshot(dict(st.groups), {}, st.hash_unit, st.settings)
            self.snaps[w] = (blob, snap)
            # A worker that never stored anything has no slot yet: an empty column.
            self.slots[w] = int(slot) if slot is not None else -1
        width = max(self.slots.values(), default=-1) + 1
        self.width = max(width, 1)
        self.matrices: dict[tuple[int, int], NDArray[np.uint8]] = {}
        for a in range(2, len(got), 4):
            g, bs = int(got[a]), int(got[a + 1])
            self.matrices[(g, bs)] = _matrix(
                len(keys_by_size[bs]), self.width, bytes(got[a + 2]), bytes(got[a + 3])
            )

    def columns(self) -> Columns:
        cohorts: dict[bytes, tuple[WorkerSnapshot, list[str]]] = {}
        unknown: list[str] = []
        slots: dict[str, int] = {}
        spare = self.width  # workers without a slot read an all-zero column
        for w, entry in self.snaps.items():
            if entry is None:
                unknown.append(w)
                continue
            blob, snap = entry
            cohorts.setdefault(blob, (snap, []))[1].append(w)
            s = self.slots[w]
            slots[w] = s if s >= 0 else spare
        mats = self.matrices
        width = self.width
        if spare in slots.values():
            width += 1
            mats = {k: np.pad(m, ((0, 0), (0, 1))) for k, m in mats.items()}
        return Columns(list(cohorts.values()), unknown, slots, mats, width)

    def snapshots(self) -> dict[str, WorkerSnapshot | None]:
        """Per worker, the media byte of each block, truncated as ``WorkerSnapshot``
        documents (full-attention groups first: their prefix bounds the others)."""
        out: dict[str, WorkerSnapshot | None] = {}
        for w, entry in self.snaps.items():
            if entry is None:
                out[w] = None
                continue
            snap = entry[1]
            s = self.slots[w]
            masks: dict[int, bytes] = {}
            order = sorted(snap.groups.items(), key=lambda kv: (kv[1].rule != "full", kv[0]))
            bound = -1
            for g, meta in order:
                mat = self.matrices.get((g, meta.block_size))
                if mat is None:
                    continue
                col = mat[:, s].tobytes() if s >= 0 else b""
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


def _matrix(n: int, width: int, lens_blob: bytes, rows: bytes) -> NDArray[np.uint8]:
    """(n x width) media masks from one table's ``lens`` and ``rows`` (rows past what
    the script read stay zero; holders at slots >= width were not asked about)."""
    out = np.zeros((n, width), dtype=np.uint8)
    if not rows:
        return out
    lens = np.frombuffer(lens_blob, dtype=">u2").astype(np.int64)
    trip = np.frombuffer(rows, dtype=np.uint8).reshape(-1, 3)
    row = np.repeat(np.arange(len(lens)), lens // 3)
    slot = (trip[:, 0].astype(np.int64) - 8) * 248 + (trip[:, 1].astype(np.int64) - 8)
    keep = slot < width
    out[row[keep], slot[keep]] = trip[keep, 2]
    return out


def fetch_args(
    prefix: str, ids: list[str], keys_by_size: dict[int, Sequence[BlockKey]]
) -> list[Any]:
    """``FETCH``'s ARGV."""
    args: list[Any] = [prefix, len(ids), *ids]
    for bs, keys in keys_by_size.items():
        args += [bs, key_blob(keys)]
    return args


__all__ = ["FETCH", "Reply", "fetch_args"]
