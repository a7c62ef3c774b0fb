"""The Redis index client's cache of worker metadata and slots, per metadata version.

Why a module of its own: the read side (``router.index.redis_read``) asks it which
workers a score covers and how to read their slots; the write side's client
(``router.index.redis``) refreshes it. While its version matches the server's, a score
sends no worker ids and its answer carries no metadata.
"""

from __future__ import annotations

from typing import Any

import msgspec

from router.index.base import WorkerSnapshot
from router.index.redis_codec import State, state_dec


class View:
    """The requested workers as the cached metadata describes them (memoized per
    request shape while the metadata version holds)."""

    __slots__ = ("by_blob", "cohorts", "packed_ids", "slots", "snaps", "spec", "unknown", "width")

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
        self.by_blob = cohorts
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
