"""The common batch, keyed without the general planner: dense GPU stores chained from a
known parent, and removals.

Why: on a busy fleet nearly every batch is a scheduler step's GPU stores (whole blocks
at the hash unit, the parent stored earlier or by an earlier store of the batch, no
extra keys) and evictions. For those the general pass (``KeyPlanner``: dense stores,
sparse placement, the fixed point, located parents, partial entries, re-announced hits,
engine-hash detection) computes exactly one chain per store from its parent, or names
every block a sibling group's store of the step named already; the per-event Python
around that was most of ingest's CPU (docs/benchmarks.md, round 3b).

``plan_simple`` first checks, without changing anything, that every event of the batch
is of that kind -- given what ``known`` names and what the batch's earlier stores add
-- and answers None otherwise (the caller runs the general path on the untouched
state). For a batch it takes it emits the same operations, counters, learned metadata
and recent token ranges as the general path (``tests/router/ingest/test_fast_path.py``
runs random streams through both).
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Sequence
from typing import Any, Protocol

from msgspec import Raw

from router import native
from router.index.base import (
    MEDIUM_BITS,
    BlockKey,
    EngineHash,
    GroupMeta,
    IndexBackend,
    Op,
    RemoveOp,
    SeqOp,
    StoreOp,
    WorkerState,
)
from router.ingest.block_keys import chain_keys, compact_keys, key_bytes, root_digest
from router.ingest.counters import IngestCounters
from router.ingest.packed import tokens as unpacked
from router.ingest.partials import PendingPartials
from router.ingest.rejects import group_ok
from schemas import MEDIUM_GPU, BlockRemoved, BlockStored, KVEventBatch, normalise_medium
from schemas.decode import PackedBlockStored


class Host(Protocol):
    """What the fast path uses of ``router.ingest.ingestor.Ingestor`` (no import cycle)."""

    counters: IngestCounters
    index: IndexBackend

    def _group(self, group_idx: object) -> int | None: ...

    def _bad(self, why: str) -> None: ...

    def _learn(self, state: WorkerState, g: int, ev: BlockStored) -> GroupMeta | None: ...


# On unless KVROUTE_INGEST_FAST_PATH=0 (every batch then takes the general path): a
# switch for telling the two apart on a live stream.
ENABLED = os.environ.get("KVROUTE_INGEST_FAST_PATH", "1") != "0"


def _scan(
    batch: KVEventBatch, unit: int, known: dict[EngineHash, BlockKey]
) -> tuple[list[EngineHash], set[EngineHash], list[EngineHash], list[EngineHash]] | None:
    """None unless every event is a removal or a whole-block GPU store at the hash unit
    without extra keys, whose blocks are all named (a sibling group's store of the
    step) or none is, by ``known`` or an earlier store of the batch. Else the parents
    the stores name (what ``router.ingest.resolve`` looks up for such a batch), the
    hashes they store (a set of all but the last store's, and the last store's list:
    most batches store once, and nothing reads a set of those), and the parents
    neither names yet (left to that lookup)."""
    parents: list[EngineHash] = []
    late: list[EngineHash] = []
    seen: set[EngineHash] = set()
    count = native.packed_len  # None: packed stores take the general path (unpacked)
    prev: list[EngineHash] = []  # the last store's blocks, not yet in seen
    for ev in batch.events:
        if type(ev) is BlockRemoved:
            continue
        if type(ev) is BlockStored:
            n_tokens = len(ev.token_ids)
        elif type(ev) is PackedBlockStored and count is not None:
            ids = ev.token_ids  # checked by router.ingest.packed
            n_tokens = len(ids) >> 2 if type(ids) is bytes else count(ids, False)
        else:
            return None
        g, bs, hashes = ev.group_idx, ev.block_size, ev.block_hashes
        if (
            not group_ok(g)  # a bad group is the general path's to reject and count
            or type(bs) is not int
            or bs != unit
            or not hashes
            or n_tokens != len(hashes) * unit
            or ev.extra_keys
            or (
                ev.medium is not None
                and ev.medium != MEDIUM_GPU
                and normalise_medium(ev.medium) != MEDIUM_GPU
            )
        ):
            return None
        sibling = hashes == prev  # a sibling group's store of the step: all named already
        if not sibling:
            seen.update(prev)
        parent = ev.parent_block_hash
        if parent is not None:
            parents.append(parent)
            if parent not in known and parent not in seen and not (sibling and parent in prev):
                late.append(parent)
        if sibling:
            continue
        if (known or seen) and not _named_alike(hashes, known, seen):
            return None
        prev = hashes
    return parents, seen, prev, late


def _named_alike(
    hashes: list[EngineHash], known: dict[EngineHash, BlockKey], seen: set[EngineHash]
) -> bool:
    h0 = hashes[0]
    if h0 in known or h0 in seen:
        return seen.issuperset(hashes) or all(h in known or h in seen for h in hashes)
    return known.keys().isdisjoint(hashes) and seen.isdisjoint(hashes)  # else partly


def _chains(batch: KVEventBatch, known: dict[EngineHash, BlockKey]) -> bool:
    """Every store's parent is named (by ``known`` or an earlier store of the batch),
    and its blocks are all named or none is (``_scan``'s check, again)."""
    seen: set[EngineHash] = set()
    for ev in batch.events:
        if type(ev) is not BlockStored and type(ev) is not PackedBlockStored:
            continue  # removals (a batch _scan took holds nothing else)
        hashes, parent = ev.block_hashes, ev.parent_block_hash
        if parent is not None and parent not in known and parent not in seen:
            return False
        if not _named_alike(hashes, known, seen):
            return False
        seen.update(hashes)
    return True


def _takes(state: WorkerState) -> bool:
    """The fast path is on and the worker's settings let it plan (partial-hash hits and
    report-full streams always take the general path). Shared by ``first_apart`` and
    ``plan_simple`` so the two agree."""
    settings = state.settings
    return ENABLED and not settings.report_full and not settings.partial_hash_hits


def first_apart(
    state: WorkerState, batch: KVEventBatch, marks: Sequence[tuple[int, ...]]
) -> list[tuple[KVEventBatch, Sequence[tuple[int, ...]]]]:
    """``batch`` as the pieces to plan, in order: whole, or - while the worker's hash mode
    is unknown (the fast path waits for it) and ``batch`` merges several published
    batches (``marks``) - the first published batch, then the rest. The general path
    learns the mode from the first, so the rest of a backlog (a start, a replay) takes
    the fast path instead of the general one. Planning the pieces in turn with one
    ``known`` gives the same operations as the merged batch (each step is order-exact)."""
    if not _takes(state) or state.hash_mode != "unknown" or len(marks) < 2:
        return [(batch, marks)]
    cut = marks[1][0]
    events = batch.events
    rank = batch.data_parallel_rank
    head = KVEventBatch(batch.ts, events[:cut], rank)
    tail = KVEventBatch(batch.ts, events[cut:], rank)
    return [(head, marks[:1]), (tail, [(m[0] - cut, *m[1:]) for m in marks[1:]])]


async def plan_simple(
    ing: Host,
    worker_id: str,
    state: WorkerState,
    batch: KVEventBatch,
    known: dict[EngineHash, BlockKey],
    marks: Sequence[tuple[int, ...]],
    pend: PendingPartials,
    recent: deque[tuple[Any, Sequence[BlockKey]]],
    ops: list[Op],
) -> bool:
    """Append the batch's operations to ``ops`` and return True, or return False with
    nothing changed but ``known`` (its parents looked up, as ``router.ingest.resolve``
    would) when the batch needs the general path."""
    unit = state.hash_unit
    if not _takes(state) or not unit or state.hash_mode == "unknown" or pend:
        return False
    scanned = _scan(batch, unit, known)
    if scanned is None:
        return False
    parents, stored, last, late = scanned
    # router.ingest.resolve for such a batch: the parents, in every map of the worker.
    todo = [h for h in set(parents) if h not in known]
    if todo:
        asked = set(todo)
        for bs in sorted({m.block_size for m in state.groups.values()} | {unit}):
            if not todo:
                break
            found = await ing.index.resolve(worker_id, bs, todo)
            known.update((h, k) for h, k in zip(todo, found, strict=True) if k is not None)
            todo = [h for h, k in zip(todo, found, strict=True) if k is None]
        # A found parent the batch also stores may change what is named: check again.
        # Else the scan's checks stand, given that every parent no earlier store of
        # the batch names was found (what ``_chains`` would check).
        located = asked.difference(todo)
        if located and (not stored.isdisjoint(located) or not located.isdisjoint(last)):
            if not _chains(batch, known):
                return False
        elif any(h not in known for h in late):
            return False
    c = ing.counters
    groups = state.groups
    chain = native.chain  # the C chain, else None (chain_keys: the same keys)
    chain_packed = native.chain_packed  # set whenever _scan let a packed store through
    chain_int32 = native.chain_int32  # (built with it)
    new_op = tuple.__new__  # a NamedTuple without its Python-level __new__
    gpu = MEDIUM_BITS[MEDIUM_GPU]
    learned: dict[tuple[Any, ...], GroupMeta] = {}
    pending = list(reversed(marks))
    push = ops.append
    stores = 0
    prev: tuple[list[EngineHash], list[EngineHash], list[BlockKey]] = ([], [], [])
    ranges: list[tuple[Any, list[BlockKey]]] = []  # the recent token ranges, in order
    ev: Any
    for i, ev in enumerate(batch.events):
        while pending and pending[-1][0] <= i:
            ops.append(SeqOp(*pending.pop()[1:]))
        gi = ev.group_idx
        g = gi if gi is not None else 0
        if type(ev) is BlockRemoved:
            c.events_removed += 1
            # ing._group's check, called (and counted) only for an odd value
            if not group_ok(gi) and ing._group(gi) is None:
                continue
            m = ev.medium
            bit = (
                gpu if m is None or m == MEDIUM_GPU else MEDIUM_BITS.get(normalise_medium(m) or "")
            )
            if bit is None:
                ing._bad(f"unknown medium {ev.medium!r}")
            elif g not in groups:
                c.blocks_removed_missing += len(ev.block_hashes)
            elif gone := pend.take_removed(g, bit, ev.block_hashes):
                push(new_op(RemoveOp, (g, bit, gone)))
            continue
        stores += 1
        # learn_group again with the same inputs and unchanged metadata changes nothing
        key = (g, ev.kv_cache_spec_kind, ev.kv_cache_spec_sliding_window)
        meta = learned.get(key)
        if meta is None or groups.get(g) is not meta:
            meta = ing._learn(state, g, ev)
            assert meta is not None  # a valid block size (checked)
            learned[key] = meta
        hashes = ev.block_hashes
        if hashes == prev[0]:  # the step's store of the previous group's blocks
            op_hashes, keys = prev[1], prev[2]  # the same lists (no op changes its lists)
            if unit < meta.block_size:
                c.partial_stores += 1
            push(new_op(StoreOp, (g, gpu, op_hashes, keys)))
            continue
        if hashes[0] in known:  # every block named (checked): a sibling group's store
            keys = keys_named = list(map(known.__getitem__, hashes))
        else:
            parent = ev.parent_block_hash
            if parent is None:
                seed = int.from_bytes(root_digest(ev.lora_name, ev.cache_salt), "big")
            else:
                seed = known[parent]
            tokens = ev.token_ids
            if type(ev) is PackedBlockStored:  # int32 ids (checked): chain() of their ints
                if type(tokens) is bytes:  # native int32s (int32_tokens)
                    got = chain_int32(seed, tokens, unit, len(hashes)) if chain_int32 else None
                else:
                    got = chain_packed(seed, tokens, unit, len(hashes)) if chain_packed else None
            else:
                got = chain(seed, tokens, unit, len(hashes)) if chain is not None else None
            keys = (
                got
                if got is not None
                else chain_keys(key_bytes(seed), unpacked(tokens), unit, len(hashes))
            )
            before = len(known)
            known.update(zip(hashes, keys))  # noqa: B905 (as many by construction)
            if len(known) - before != len(hashes):  # a hash twice: known names its last key
                keys_named = list(map(known.__getitem__, hashes))
            else:
                keys_named = keys
            ranges.append((tokens, keys))
        if unit < meta.block_size:
            c.partial_stores += 1
        op_hashes = list(hashes)
        prev = (hashes, op_hashes, keys_named)
        push(new_op(StoreOp, (g, gpu, op_hashes, keys)))
    c.events_stored += stores
    ops += [SeqOp(*m[1:]) for m in reversed(pending)]
    # Only the ranges ``recent`` keeps (a merged backlog stores far more than it holds);
    # a packed store's own bytes: a view would pin its whole payload.
    cap = recent.maxlen
    recent.extend(
        (t.copy() if type(t) is Raw else t, compact_keys(k))
        for t, k in (ranges if cap is None else ranges[-cap:])
    )
    return True
