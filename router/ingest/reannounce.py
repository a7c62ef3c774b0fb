"""Which chain starts of a batch are vLLM re-announcements, not new copies.

vLLM 0.33 (``KVCacheManager.get_computed_blocks``): a request with
``kv_cache_report_mode: "full"`` that hits the prefix cache re-sends its hit as one
``BlockStored`` per group (``emit_cached_block_events``): parent None, tokens from 0, a
hash for *every* block of the hit -- in sliding-window and mamba groups also for blocks
that are null (out of the window, no state). The blocks are cached already: they are no
new copies, and the null ones are not cached at all. A store that recomputes a prefix
from 0 (``cache_full_blocks``) has the same shape.

What tells them apart, from vLLM's code: a hit needs every full-attention block cached
at lookup time, and every other group to accept the hit's end (a sliding-window group
its last ``ceil((W - 1) / b)`` blocks, a mamba group its last block); a recompute from 0
happens only when the lookup missed. So a full-attention chain start whose blocks the
worker holds at that point of the stream (held before the batch or stored earlier in
it, and not removed since), whose other groups' chain starts over the same tokens are
dense and hold the hit's end, is taken for a re-announcement -- and so are those other
groups' chain starts. What stays ambiguous is a recompute that a lookup could not have
missed by these rules: a request that skips the prefix cache (prompt logprobs) or whose
cap cut its hit (a one-block prompt). Such copies are taken for re-announcements: the
index then counts one copy too few (an under-estimate once the other copy goes), never
one too many (docs/vllm.md, "What cannot be known").
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Sequence
from typing import TypeGuard

from router.index.base import GPU_BIT, BlockKey, EngineHash, IndexBackend, WorkerState
from router.ingest.recomputes import RecomputeLog, Record
from schemas import (
    MEDIUM_GPU,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    normalise_medium,
)
from schemas.hit_rule import FULL_KINDS, GroupSpec

# vLLM emits one re-announcement per group back to back: partners are this close.
_PARTNER_SPAN = 8


class Unwritten:
    """Copies stored minus copies removed per (group, hash) by batches planned but not
    yet written to the index (a subscriber applies what it has received in one write),
    and by the batch's own earlier events: a block is held at a point of the stream when
    the index's copies plus these are above 0."""

    def __init__(self) -> None:
        self.delta: dict[tuple[int, EngineHash], int] = {}
        self.cleared = False  # an AllBlocksCleared: the index's copies are void

    def held(self, g: int, h: EngineHash, before: dict[tuple[int, EngineHash], int]) -> bool:
        base = 0 if self.cleared else before.get((g, h), 0)
        return base + self.delta.get((g, h), 0) > 0

    def store(self, g: int, hashes: Sequence[EngineHash]) -> None:
        d = self.delta
        for h in hashes:
            d[(g, h)] = d.get((g, h), 0) + 1

    def remove(self, g: int, hashes: Sequence[EngineHash]) -> None:
        d = self.delta
        for h in hashes:
            d[(g, h)] = d.get((g, h), 0) - 1

    def clear(self) -> None:
        self.delta.clear()
        self.cleared = True


def _chain_start(ev: object) -> TypeGuard[BlockStored]:
    return (
        isinstance(ev, BlockStored)
        and ev.parent_block_hash is None
        and bool(ev.token_ids)
        and bool(ev.block_hashes)
        and _on_gpu(ev)
    )


def _on_gpu(ev: BlockStored | BlockRemoved) -> bool:
    return normalise_medium(ev.medium) == MEDIUM_GPU


def _group(ev: BlockStored | BlockRemoved) -> int:
    return ev.group_idx if isinstance(ev.group_idx, int) else 0


def _tail(state: WorkerState, ev: BlockStored, kind: str) -> int:
    """How many of a partner's last blocks a hit ending at its range end needs."""
    meta = state.groups.get(_group(ev))
    spec = (
        meta.spec()
        if meta is not None
        else GroupSpec(kind, ev.block_size or 1, ev.kv_cache_spec_sliding_window)
    )
    if spec.rule == "sliding":
        return spec.window_blocks
    if spec.rule == "mamba":
        return 1
    return len(ev.block_hashes)


async def find_reannouncements(
    index: IndexBackend,
    worker_id: str,
    state: WorkerState,
    batch: KVEventBatch,
    kind_of: Callable[[BlockStored], str],
    starts: Sequence[int] = (),
    unwritten: Unwritten | None = None,
    recomputes: RecomputeLog | None = None,
) -> set[int]:
    """Indices of the batch's stores that re-announce a hit (see the module doc).

    ``starts``: where each published batch (one engine step) begins in this merged
    batch; partners are looked for within one step. ``unwritten``: changes of earlier
    batches not in the index yet; this batch's are added to it. ``recomputes``: the
    worker's log of earlier calls; its ``fixes`` get this batch's corrections."""
    delta = unwritten if unwritten is not None else Unwritten()
    events = batch.events
    starts_of = {i: ev for i, ev in enumerate(events) if _chain_start(ev)}
    cands: dict[int, list[int]] = {}  # full-attention chain start -> partners
    for i, head in starts_of.items():
        if kind_of(head) not in FULL_KINDS:
            continue
        step = bisect_right(starts, i)
        found: list[int] = []
        for j in range(i + 1, min(len(events), i + 1 + _PARTNER_SPAN)):
            other = starts_of.get(j)
            if (
                isinstance(other, BlockStored)
                and bisect_right(starts, j) == step
                and other.token_ids == head.token_ids
                and _group(other) != _group(head)
                and kind_of(other) not in FULL_KINDS
            ):
                found.append(j)
        cands[i] = found
    log = recomputes if recomputes is not None else RecomputeLog()
    log.fixes = {}
    # Stores continuing a chain start taken for a re-announcement: their first block's
    # copies are needed to tell whether it was a recompute (``router.ingest.recomputes``).
    follow: dict[int, set[EngineHash]] = {}
    proves = _plain_full(state)
    if proves and (log.records or cands):
        lasts = {(_group(ev), ev.block_hashes[-1]) for ev in starts_of.values()}
        lasts.update(log.records)
        for ev in events:
            if (
                isinstance(ev, BlockStored)
                and _continues(ev)
                and (_group(ev), ev.parent_block_hash) in lasts
            ):
                follow.setdefault(_group(ev), set()).add(ev.block_hashes[0])
    member, names = (
        await _held_before(index, worker_id, state, events, cands, follow)
        if cands or follow
        else ({}, {})
    )
    out: set[int] = set()

    def held(g: int, h: EngineHash) -> bool:
        return delta.held(g, h, member)

    for i, ev in enumerate(events):
        partners = cands.get(i)
        if partners is not None and i not in out:
            assert isinstance(ev, BlockStored)
            mates = [events[j] for j in partners]
            if _is_reannouncement(state, ev, mates, held, kind_of):  # type: ignore[arg-type]
                out.add(i)
                out.update(partners)
                log.record(_record(log.pos, ev, mates, names))  # type: ignore[arg-type]
        if proves and isinstance(ev, BlockStored) and _continues(ev):
            rec = log.follows(_group(ev), ev.parent_block_hash)
            x = ev.block_hashes[0]
            if rec is not None and held(rec.group, x) and log.proves(rec, x):
                for g, hashes in log.correct(i, rec):
                    delta.store(g, hashes)
        if isinstance(ev, BlockStored) and ev.block_hashes and _on_gpu(ev):
            log.note_end(_group(ev), ev.block_hashes[-1])
        if i not in out:  # a re-announcement names blocks already cached: no change
            if isinstance(ev, BlockStored) and _on_gpu(ev):
                delta.store(_group(ev), ev.block_hashes)
                log.note(_group(ev), ev.block_hashes, stored=True)
            elif isinstance(ev, BlockRemoved) and _on_gpu(ev):
                delta.remove(_group(ev), ev.block_hashes)
                log.note(_group(ev), ev.block_hashes, stored=False)
            elif isinstance(ev, AllBlocksCleared):
                delta.clear()
                log.clear()
        log.advance()
    return out


def _plain_full(state: WorkerState) -> bool:
    """Only full attention, no EAGLE: a lookup then hits every held block below the cap.
    (With another group a hit can stop before a held full-attention block, the other
    group lacking its window or state; EAGLE drops the last matched block. Either way
    the block is recomputed by a request that read the cache.)"""
    groups = state.groups.values()
    return bool(groups) and not state.settings.eagle and all(m.rule == "full" for m in groups)


def _continues(ev: BlockStored) -> bool:
    """Two or more whole blocks on GPU after a parent: a prefill chunk (a decode step
    fills one block at a time) -- see ``router.ingest.recomputes``."""
    bs = ev.block_size
    n = len(ev.block_hashes)
    return (
        ev.parent_block_hash is not None
        and n >= 2
        and isinstance(bs, int)
        and n * bs == len(ev.token_ids)
        and _on_gpu(ev)
    )


def _record(
    pos: int,
    ev: BlockStored,
    mates: list[BlockStored],
    names: dict[tuple[int, EngineHash], BlockKey],
) -> Record:
    """What to give back if the chain start turns out to be a recompute: its blocks
    and its partners' that the map names (held then)."""
    blocks = []
    for e in (ev, *mates):
        g = _group(e)
        named = [(h, names[(g, h)]) for h in e.block_hashes if (g, h) in names]
        if named:
            blocks.append((g, [h for h, _ in named], [k for _, k in named]))
    return Record(pos, _group(ev), ev.block_hashes[-1], blocks)


def _is_reannouncement(
    state: WorkerState,
    ev: BlockStored,
    partners: list[BlockStored],
    held: Callable[[int, EngineHash], bool],
    kind_of: Callable[[BlockStored], str],
) -> bool:
    g = _group(ev)
    if not all(held(g, h) for h in ev.block_hashes):
        return False
    for p in partners:
        bs = p.block_size or 0
        # Sparse: ``cache_full_blocks`` skipped null blocks; a re-announcement names them.
        if bs <= 0 or len(p.block_hashes) * bs != len(p.token_ids):
            return False
        tail = _tail(state, p, kind_of(p))
        if not all(held(_group(p), h) for h in p.block_hashes[-tail:]):
            return False
    return True


async def _held_before(
    index: IndexBackend,
    worker_id: str,
    state: WorkerState,
    events: Sequence[object],
    cands: dict[int, list[int]],
    follow: dict[int, set[EngineHash]],
) -> tuple[dict[tuple[int, EngineHash], int], dict[tuple[int, EngineHash], BlockKey]]:
    """Copies on GPU before the batch of every (group, hash) the candidates and the
    continuations (``follow``) name: the hashes looked up in the map (``resolve``),
    their copies read per group (``copies``); and the keys the map gave."""
    wanted: dict[int, set[EngineHash]] = {g: set(hs) for g, hs in follow.items()}
    for i, partners in cands.items():
        for j in (i, *partners):
            ev = events[j]
            assert isinstance(ev, BlockStored)
            wanted.setdefault(_group(ev), set()).update(ev.block_hashes)
    out: dict[tuple[int, EngineHash], int] = {}
    names: dict[tuple[int, EngineHash], BlockKey] = {}
    for g, hashes in wanted.items():
        if g not in state.groups:
            continue
        hs = list(hashes)
        found = await index.resolve(worker_id, state.groups[g].block_size, hs, live_only=True)
        named = [(h, k) for h, k in zip(hs, found, strict=True) if k is not None]
        if not named:
            continue
        names.update(((g, h), k) for h, k in named)
        counts = await index.copies(worker_id, g, [k for _, k in named], GPU_BIT)
        out.update(((g, h), n) for (h, _), n in zip(named, counts, strict=True) if n)
    return out, names
