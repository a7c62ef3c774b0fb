"""Write side: apply decoded KV event batches to an index backend.

A batch goes through three steps and few backend calls: collect the engine hashes the
batch cannot resolve by itself (parents stored earlier, token-less offload stores, the
kept blocks of sparse stores), ``resolve`` them, compute every store's block keys (see
``router.ingest.placement`` for vLLM's sparse, partial and mixed-size stores; stores
whose parent another store of the batch names wait for it), then turn every event into
a keyed operation in order and hand the list to ``apply`` (one Redis round trip).
Learned metadata (group kind / block size / window, the hash unit, hash mode) is saved
first, when it changed, so blocks never exist in the backend without it.

Copies: vLLM does not de-duplicate cached blocks, so a store of a block already held is
another copy and a removal takes one copy (the backends count them).

Bad input is counted, never raised: an event with an unknown medium, a group index or
block size out of bounds, a token count that does not match its blocks
(``router.ingest.rejects``: such a store is rejected before anything is learned from
its batch, so it changes nothing), or a store whose parent was never seen
(``unknown_parent``; its key cannot be computed, so it is not guessed). Only
``IndexUnavailable`` escapes, so the transport can retry the batch.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from router.index.base import (
    MEDIUM_BITS,
    BlockKey,
    ClearOp,
    EngineHash,
    EngineSettings,
    GroupMeta,
    IndexBackend,
    Op,
    RemoveOp,
    SeqOp,
    StoreOp,
    WorkerState,
)
from router.ingest.block_keys import compact_keys
from router.ingest.clears import ClearLog, ClearMark
from router.ingest.counters import IngestCounters
from router.ingest.fast_path import first_apart, plan_simple
from router.ingest.key_planner import Keyed, KeyPlanner
from router.ingest.learning import block_size as _size
from router.ingest.learning import learn_group, learn_unit
from router.ingest.packed import unpack
from router.ingest.partials import PendingPartials, register
from router.ingest.reannounce import Unwritten, find_reannouncements
from router.ingest.recomputes import RecomputeLog
from router.ingest.rejects import BAD_MEDIUM, BadEvents, Rejected, screen
from router.ingest.resolve import resolve_parents
from schemas import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    normalise_medium,
)
from schemas.rest import GroupInfo

log = logging.getLogger(__name__)

RECENT_RANGES = 64

# (index of the batch's first event in a merged batch, DP rank, seq, payload crc32[,
# the seq the writer applied before it: ``SeqOp.follows``])
SeqMark = tuple[int, ...]


class Ingestor:
    """Applies batches per worker; metadata is cached here and persisted in the backend."""

    def __init__(
        self,
        index: IndexBackend,
        *,
        default_kind: str = "full_attention",
        default_block_size: int | None = None,
        metrics: IngestCounters | None = None,
    ) -> None:
        self.index = index
        self.default_kind = default_kind
        self.default_block_size = default_block_size
        self.counters = metrics if metrics is not None else IngestCounters()
        self._states: dict[str, WorkerState] = {}
        # Per worker, the token ranges of recent stores with their unit keys: where a
        # parent no event named is found by its tokens (``KeyPlanner._locate``).
        self._recent: dict[str, deque[tuple[Any, Sequence[BlockKey]]]] = {}
        # Bad input repeats for as long as its cause lasts: the first few per kind of
        # fault, then one line a minute with the count suppressed meanwhile.
        self._faults = BadEvents(self.counters, log)
        self._partials: dict[str, PendingPartials] = {}  # partial entries not keyed yet
        self._waiting = register(index, self._partials)  # scorers look them up
        self._recomputes: dict[str, RecomputeLog] = {}  # report_full workers only
        # Called with the worker id once the index took an AllBlocksCleared of that
        # worker: the engine's cache was reset (not on a resync; router.ingest.clears).
        self.on_clear: list[Callable[[str], None]] = []
        self._clears = ClearLog()

    # -- worker lifecycle -------------------------------------------------------------

    async def _state(self, worker_id: str) -> WorkerState:
        state = self._states.get(worker_id)
        if state is None:
            state = await self.index.load_worker(worker_id)
            if state is None:
                state = WorkerState()
                await self.index.save_worker(worker_id, state)
            self._states[worker_id] = state
        return state

    async def clear_worker(self, worker_id: str) -> None:
        """AllBlocksCleared / resync: drop entries, keep the worker and its groups known."""
        state = await self._state(worker_id)
        await self.index.clear_worker(worker_id)
        pending = self._partials.pop(worker_id, None)  # not _pending(): it would add one
        if pending is not None:
            pending.clear()
        self._recomputes.pop(worker_id, None)
        self.counters.worker_clears += 1
        if state.hash_mode != "unknown":
            state.hash_mode = "unknown"
            await self.index.save_worker(worker_id, state)

    async def configure(self, worker_id: str, settings: EngineSettings) -> None:
        """Set a worker's engine settings (registration); the hash unit follows them."""
        state = await self._state(worker_id)
        if state.settings == settings:
            return
        unit = settings.hash_block_size
        if unit is not None and state.hash_unit not in (None, unit):
            await self.clear_worker(worker_id)  # keys chained at another unit are void
        state.settings = settings
        if unit is not None:
            state.hash_unit = unit
        await self.index.save_worker(worker_id, state)

    def forget(self, worker_id: str) -> None:
        """Drop the cached metadata (the index lost it); reloaded or rebuilt on use."""
        self._states.pop(worker_id, None)

    async def remove_worker(self, worker_id: str) -> None:
        """Entries, maps and metadata gone (``DELETE /v1/workers/{id}``)."""
        self._states.pop(worker_id, None)
        self._recent.pop(worker_id, None)
        pending = self._partials.pop(worker_id, None)  # not _pending(): it would add one
        if pending is not None:
            pending.clear()
        self._recomputes.pop(worker_id, None)
        self._clears.forget(worker_id)
        await self.index.remove_worker(worker_id)

    async def worker_groups(self, worker_id: str) -> dict[int, GroupInfo]:
        state = self._states.get(worker_id) or await self.index.load_worker(worker_id)
        if state is None:
            return {}
        counts = await self.index.group_counts(worker_id)
        return {
            g: GroupInfo(
                kind=meta.kind,
                block_size=meta.block_size,
                sliding_window=meta.sliding_window,
                blocks_by_medium=counts.get(g, {}),
            )
            for g, meta in sorted(state.groups.items())
        }

    async def hash_mode(self, worker_id: str) -> str:
        """``unknown`` until a chain's first block was checked, then ``engine`` (vLLM
        default hashing reproduced) or ``canonical`` (foreign hashing)."""
        state = self._states.get(worker_id) or await self.index.load_worker(worker_id)
        return state.hash_mode if state is not None else "unknown"

    # -- the write path ---------------------------------------------------------------

    def _pending(self, worker_id: str) -> PendingPartials:
        got = self._partials.get(worker_id)
        if got is None:
            got = self._partials[worker_id] = PendingPartials(
                self.counters, worker=worker_id, active=self._waiting
            )
        return got

    def _bad(self, why: str) -> None:
        self._faults.bad(why)  # a free-text reason (router.ingest.rejects.BadEvents.bad)

    def _group(self, group_idx: object) -> int | None:
        """The event's group (absent = 0), or None (counted) for a value no engine sends."""
        return self._faults.group(group_idx)

    def _learn(self, state: WorkerState, g: int, ev: BlockStored) -> GroupMeta | None:
        return learn_group(state, g, ev, self.default_kind, self.default_block_size, self.counters)

    async def apply_batch(
        self, worker_id: str, batch: KVEventBatch, marks: Sequence[SeqMark] = ()
    ) -> dict[str, int]:
        """Apply a batch's events in order; problems are counted, never raised.

        ``marks`` are the ``SeqMark``s of the published batches merged into ``batch``:
        the index applies each one at most once. Returns ``apply_batches``' answer."""
        return await self.apply_batches([(worker_id, batch, marks)])

    async def apply_batches(
        self, items: Sequence[tuple[str, KVEventBatch] | tuple[str, KVEventBatch, Any]]
    ) -> dict[str, int]:
        """Apply several batches (any workers) in order with one backend write call.

        For Redis that is one pipelined round trip for all of them, so a subscriber that
        drains what it has received so far overlaps its work with the server's. Returns,
        per worker some of whose batches the index deferred (``SeqOp.follows``), the
        position it showed (``ApplyResult.deferred_at``).
        """
        plans: list[tuple[str, dict[int, GroupMeta], list[Op]]] = []
        carried: dict[str, dict[EngineHash, BlockKey]] = {}
        # Per worker, what earlier batches of this call changed (not yet in the index).
        unwritten: dict[str, Unwritten] = {}
        cleared: list[tuple[str, ClearMark]] = []
        for item in items:
            worker_id, batch = item[0], item[1]
            marks = item[2] if len(item) > 2 else ()
            known = carried.setdefault(worker_id, {})
            delta = unwritten.setdefault(worker_id, Unwritten())
            state = await self._state(worker_id)
            self.counters.batches += 1
            for piece, piece_marks in first_apart(state, batch, marks):
                groups, ops = await self._plan(worker_id, piece, known, piece_marks, delta, cleared)
                if ops:
                    plans.append((worker_id, groups, ops))
        if not plans:
            return {}
        deferred: dict[str, int] = {}
        results = await self.index.apply_many(plans)
        for (worker_id, _, _), result in zip(plans, results, strict=True):
            if self.counters.count_applied(result):
                deferred[worker_id] = result.deferred_at
        if cleared:
            self._clears.report(self.on_clear, cleared)
        return deferred

    def _kind(self, state: WorkerState, ev: BlockStored) -> str:
        if ev.kv_cache_spec_kind:
            return ev.kv_cache_spec_kind
        meta = state.groups.get(ev.group_idx if isinstance(ev.group_idx, int) else 0)
        return meta.kind if meta is not None else self.default_kind

    async def _plan(
        self,
        worker_id: str,
        batch: KVEventBatch,
        known: dict[EngineHash, BlockKey],
        marks: Sequence[SeqMark],
        delta: Unwritten,
        cleared: list[tuple[str, ClearMark]],
    ) -> tuple[dict[int, GroupMeta], list[Op]]:
        """A batch as keyed operations; ``known`` carries mappings between batches, and
        ``cleared`` gets the batch's AllBlocksCleared events (the worker, their marks)."""
        state = await self._state(worker_id)
        before = (dict(state.groups), state.hash_mode, state.hash_unit)
        ops: list[Op] = []
        pend = self._pending(worker_id)
        recent = self._recent.setdefault(worker_id, deque(maxlen=RECENT_RANGES))
        # The fast path takes only stores at the current unit (the unit stays) in a valid
        # group; rejected stores are learned from by nothing.
        if not await plan_simple(self, worker_id, state, batch, known, marks, pend, recent, ops):
            batch = unpack(batch)  # the general path reads token ids as ints
            unit = state.settings.hash_block_size
            batch = screen(batch, self.default_block_size, unit)
            learn_unit(state, batch, ops, known, self.default_block_size, self.counters)
            if ops:  # a new hash unit voided every key
                pend.clear()
                self._recomputes.pop(worker_id, None)
            await resolve_parents(
                self.index, worker_id, state, batch, known, self.default_block_size
            )
            clears = await self._general(
                worker_id, state, batch, known, marks, delta, pend, recent, ops
            )
            cleared += [(worker_id, m) for m in clears]
        if (state.groups, state.hash_mode, state.hash_unit) != before:
            await self.index.save_worker(worker_id, state)
        return dict(state.groups), ops

    async def _general(
        self,
        worker_id: str,
        state: WorkerState,
        batch: KVEventBatch,
        known: dict[EngineHash, BlockKey],
        marks: Sequence[SeqMark],
        delta: Unwritten | None,
        pend: PendingPartials,
        recent: deque[tuple[Any, Sequence[BlockKey]]],
        ops: list[Op],
    ) -> list[ClearMark]:
        """Any batch: keys by ``KeyPlanner``, then the operations in event order; the
        marks of its AllBlocksCleared events."""
        c = self.counters
        planner = KeyPlanner(state, batch, known, self.default_block_size, recent)
        if state.settings.report_full:
            planner.reannounced = await find_reannouncements(
                self.index,
                worker_id,
                state,
                batch,
                partial(self._kind, state),
                [m[0] for m in marks],
                delta,
                self._recomputes.setdefault(worker_id, RecomputeLog()),
            )
        fixes = self._recomputes[worker_id].fixes if state.settings.report_full else {}
        keyed = planner.run()
        recent.extend((t, compact_keys(u)) for t, u, here in planner.ranges if here)

        pending = list(reversed(marks))
        mark: ClearMark = None
        clears: list[ClearMark] = []
        for i, ev in enumerate(batch.events):
            while pending and pending[-1][0] <= i:
                m = pending.pop()
                ops.append(SeqOp(*m[1:]))
                mark = (m[1], m[2], m[3])
            ops += fixes.get(i, ())  # copies a recompute was denied (router.ingest.recomputes)
            if isinstance(ev, BlockStored):
                c.events_stored += 1
                self._store(state, ev, keyed.get(i), ops, pend)
            elif isinstance(ev, BlockRemoved):
                c.events_removed += 1
                g = self._group(ev.group_idx)
                bit = MEDIUM_BITS.get(normalise_medium(ev.medium) or "")
                if g is None:
                    continue
                if bit is None:
                    self._faults.bad(BAD_MEDIUM, ev.medium)
                elif g not in state.groups:
                    c.blocks_removed_missing += len(ev.block_hashes)
                elif gone := pend.take_removed(g, bit, ev.block_hashes):
                    ops.append(RemoveOp(g, bit, gone))
            elif isinstance(ev, AllBlocksCleared):
                c.events_cleared += 1
                ops.append(ClearOp())
                clears.append(mark)
                pend.clear()
                state.hash_mode = "unknown"
            elif isinstance(ev, Rejected):  # a store screen() rejected
                c.events_stored += 1
                self._faults.reject(ev)
            else:
                c.events_unknown += 1

        pend.place(planner, known)
        ops += pend.ready(known)
        ops += [SeqOp(*m[1:]) for m in reversed(pending)]  # batches with no events
        return clears

    def _store(
        self,
        state: WorkerState,
        ev: BlockStored,
        keyed: Keyed | None,
        ops: list[Op],
        pend: PendingPartials,
    ) -> None:
        """An accepted store (``screen`` passed it): learn from it, emit its op."""
        c = self.counters
        g = self._group(ev.group_idx)
        bit = MEDIUM_BITS.get(normalise_medium(ev.medium) or "")
        if g is None or bit is None:  # screened: never
            return
        if keyed is not None and keyed.error:  # before learning: a bad store changes nothing
            self._bad(keyed.error)
            return
        meta = self._learn(state, g, ev)
        if meta is None:
            self._bad(f"invalid block_size {ev.block_size!r}")
            return
        if keyed is None:  # no blocks: an empty (fully masked) store
            return
        if keyed.reannounce:
            c.reannounced_blocks += len(ev.block_hashes)
            return
        if keyed.sparse:
            c.sparse_stores += 1
        if (_size(ev.block_size) or meta.block_size) < meta.block_size:
            c.partial_stores += 1
        c.unknown_parent += keyed.unknown_parent
        if keyed.partial_unknown_prefix:
            unkeyed = [h for h in ev.block_hashes if h not in keyed.hashes]
            pend.add(g, bit, ev, unkeyed, state.hash_unit)
        c.unresolved_blocks += keyed.unresolved
        c.unplaced_blocks += keyed.unplaced
        if keyed.hashes:
            ops.append(StoreOp(g, bit, keyed.hashes, keyed.keys))
        if keyed.algo_checked and state.hash_mode == "unknown":
            state.hash_mode = keyed.algo_checked
