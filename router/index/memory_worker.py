"""The memory index's per-worker record, and the ghost mappings of removed blocks.

Its own module so ``router.index.memory`` (the tables and the write loop) stays short.
"""

from __future__ import annotations

from typing import Any

from router.index.base import BlockKey, EngineHash, WorkerSnapshot, WorkerState

# Mappings of removed blocks kept per (worker, block size), in two generations of at most
# this many: an engine may chain a new block from a parent that left every tier (a
# sliding-window block, an evicted prefix), and only the mapping can name that parent.
GHOST_ENTRIES = 65_536


class Worker:
    """A worker's slot, maps, counts, copies and seqs in the memory index."""

    __slots__ = (
        "copies",
        "counts",
        "entries",
        "fast",
        "fast_remove",
        "ghosts",
        "layout",
        "maps",
        "plan",
        "seqs",
        "slot",
        "snap",
        "state",
    )

    def __init__(self, state: WorkerState, slot: int, layout: int) -> None:
        self.slot = slot
        self.maps: dict[int, dict[EngineHash, BlockKey]] = {}
        # Per block size, mappings of blocks gone from every tier: [newer, older].
        self.ghosts: dict[int, list[dict[EngineHash, BlockKey]]] = {}
        self.counts: dict[int, list[int]] = {}  # group -> blocks per medium
        self.entries: dict[int, int] = {}  # group -> keys held on any medium
        # (group, medium bit, key) -> copies beyond the first: vLLM keeps duplicates,
        # and an entry stays hittable until its last copy is removed. Only keys with
        # more than one copy are here, so the usual single copy costs nothing.
        self.copies: dict[tuple[int, int, BlockKey], int] = {}
        self.seqs: dict[int, tuple[int, int]] = {}  # rank -> last applied (seq, print)
        self.set_state(state, layout)

    def set_state(self, state: WorkerState, layout: int) -> None:
        # (group, medium bit) -> what the C store loop takes (``MemoryIndex.apply``):
        # set by a group's first StoreOp, so later ones skip the lookups; emptied with
        # the metadata or the maps it names
        self.fast: dict[tuple[int, int], tuple[Any, ...]] = {}
        # The same for a RemoveOp's C loop, once every sibling table exists.
        self.fast_remove: dict[tuple[int, int], tuple[Any, ...]] = {}
        self.layout = layout  # workers with equal metadata share it (one cohort)
        self.state = state.copy()
        # Full-attention groups first: their prefix bounds what the others need to read.
        order = sorted(state.groups.items(), key=lambda kv: (kv[1].rule != "full", kv[0]))
        self.plan = [(g, m.block_size, m.rule == "full") for g, m in order]
        # Metadata for ``fetch_columns`` (masks stay empty): built once, shared.
        self.snap = WorkerSnapshot(dict(state.groups), {}, state.hash_unit, state.settings)


def add_ghosts(w: Worker, bs: int, gone: list[tuple[EngineHash, BlockKey]], cap: int) -> None:
    """Remember the (engine hash, key) mappings of blocks gone from every tier, in
    order, in generations of at most ``cap`` (a full one becomes the older, the older
    goes), a generation's worth at a time."""
    gens = w.ghosts.get(bs)
    if gens is None:
        gens = w.ghosts[bs] = [{}, {}]
    while gone:
        room = max(1, cap - len(gens[0]))
        gens[0].update(gone[:room])
        gone = gone[room:]
        if len(gens[0]) >= cap:  # a new generation; the oldest goes
            gens[1] = gens[0]
            gens[0] = {}
