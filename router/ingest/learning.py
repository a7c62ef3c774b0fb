"""What ingest learns from stores: each group's kind, block size and window, and the
worker's hash unit.

Its own module because these rules (the largest size a store showed wins, a shrinking
unit voids chained keys) are policy about the engine's model, separate from turning
events into keyed operations (``router.ingest.ingestor``). Both learn from accepted
stores only: the ingestor screens a batch first (``router.ingest.rejects``), since a
size learned from a store it then rejects would stay for good.
"""

from __future__ import annotations

import math

from router.index.base import ClearOp, GroupMeta, Op, WorkerState
from router.ingest.counters import IngestCounters
from schemas import BlockStored, KVEventBatch
from schemas.hit_rule import FULL_KINDS, MAMBA_KINDS


def block_size(value: object) -> int | None:
    """A positive int block size, or None."""
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        return None
    return value


def learn_group(
    state: WorkerState,
    g: int,
    ev: BlockStored,
    default_kind: str,
    default_block_size: int | None,
    counters: IngestCounters,
) -> GroupMeta | None:
    """The group's metadata after this (accepted) store. Its block size is the largest
    a store showed: a smaller one is a partial entry (vLLM stores the prompt's tail
    inside a larger block at the hash unit), never a new model (that comes with a
    clear)."""
    bs = block_size(ev.block_size)
    if bs is None:
        if default_block_size is None:
            return None
        bs = default_block_size
    old = state.groups.get(g)
    kind = ev.kv_cache_spec_kind or (old.kind if old is not None else default_kind)
    window = ev.kv_cache_spec_sliding_window
    if window is None and old is not None and old.kind == kind:
        window = old.sliding_window
    size = bs if old is None else max(old.block_size * old.block_units, bs)
    unit, units = state.hash_unit, 1
    # vLLM's partial-hash hits look mamba states up at every hash unit and full
    # attention's partial entries inside a block: such groups are indexed per unit
    # (``GroupMeta.block_units``; the hit rule in ``schemas.hit_rule``).
    fine = kind in MAMBA_KINDS or kind in FULL_KINDS
    if state.settings.partial_hash_hits and fine and unit and size > unit and not size % unit:
        size, units = unit, size // unit
    if (
        old is not None
        and old.kind == kind
        and old.block_size == size
        and old.sliding_window == window
        and old.block_units == units
    ):
        return old
    if old is not None:
        counters.group_changes += 1
    meta = state.groups[g] = GroupMeta(kind, size, window, units)
    return meta


def learn_unit(
    state: WorkerState,
    batch: KVEventBatch,
    ops: list[Op],
    known: dict,
    default_block_size: int | None,
    counters: IngestCounters,
) -> None:
    """The hash unit: registered, else the gcd of every block size seen (``batch`` is
    screened: a rejected store is a ``Rejected``, not a ``BlockStored``). A unit that
    shrinks voids the keys chained so far (counted; register ``hash_block_size``).
    Clears keep it: relearning it after each would void keys again and again."""
    if state.settings.hash_block_size is not None:
        state.hash_unit = state.settings.hash_block_size
        return
    unit = state.hash_unit or 0
    for ev in batch.events:
        if isinstance(ev, BlockStored):
            bs = ev.block_size
            if bs == unit and unit and type(bs) is int:
                continue  # the gcd stays (most stores)
            size = block_size(bs) or default_block_size
            if size is not None:
                unit = math.gcd(unit, size)
    if unit == 0 or unit == state.hash_unit:
        return
    if state.hash_unit is not None:
        counters.hash_unit_changes += 1
        ops.append(ClearOp())
        known.clear()
        state.hash_mode = "unknown"
    state.hash_unit = unit
