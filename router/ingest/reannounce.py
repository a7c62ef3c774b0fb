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

from router.index.base import GPU_BIT, BlockKey, EngineHash, IndexBackend, WorkerState
from schemas import BlockRemoved, BlockStored, KVEventBatch
from schemas.hit_rule import FULL_KINDS, GroupSpec

# vLLM emits one re-announcement per group back to back: partners are this close.
_PARTNER_SPAN = 8


def _chain_start(ev: object) -> bool:
    return (
        isinstance(ev, BlockStored)
        and ev.parent_block_hash is None
        and bool(ev.token_ids)
        and bool(ev.block_hashes)
    )


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
) -> set[int]:
    """Indices of the batch's stores that re-announce a hit (see the module doc).

    ``starts``: where each published batch (one engine step) begins in this merged
    batch; partners are looked for within one step."""
    events = batch.events
    cands: list[tuple[int, list[int]]] = []
    for i, ev in enumerate(events):
        if not _chain_start(ev) or kind_of(ev) not in FULL_KINDS:  # type: ignore[arg-type]
            continue
        assert isinstance(ev, BlockStored)
        step = bisect_right(starts, i)
        partners = [
            j
            for j in range(i + 1, min(len(events), i + 1 + _PARTNER_SPAN))
            if bisect_right(starts, j) == step
            and _chain_start(events[j])
            and events[j].token_ids == ev.token_ids  # type: ignore[union-attr]
            and _group(events[j]) != _group(ev)  # type: ignore[arg-type]
            and kind_of(events[j]) not in FULL_KINDS  # type: ignore[arg-type]
        ]
        cands.append((i, partners))
    if not cands:
        return set()
    member = await _held_before(index, worker_id, state, events, cands)
    out: set[int] = set()
    stored: dict[int, set[EngineHash]] = {}
    removed: dict[int, set[EngineHash]] = {}
    todo = {i: partners for i, partners in cands}

    def held(g: int, h: EngineHash) -> bool:
        if h in stored.get(g, ()):
            return True
        return h not in removed.get(g, ()) and h in member.get(g, ())

    for i, ev in enumerate(events):
        partners = todo.get(i)
        if partners is not None and i not in out:
            assert isinstance(ev, BlockStored)
            if _is_reannouncement(state, ev, [events[j] for j in partners], held, kind_of):  # type: ignore[misc]
                out.add(i)
                out.update(partners)
        if i in out:
            continue  # names blocks already cached (or null ones): no change
        if isinstance(ev, BlockStored):
            g = _group(ev)
            stored.setdefault(g, set()).update(ev.block_hashes)
            removed.get(g, set()).difference_update(ev.block_hashes)
        elif isinstance(ev, BlockRemoved):
            g = _group(ev)
            removed.setdefault(g, set()).update(ev.block_hashes)
            stored.get(g, set()).difference_update(ev.block_hashes)
    return out


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
        if bs <= 0 or len(p.block_hashes) * bs != len(p.token_ids):
            return (
                False  # sparse: cache_full_blocks skipped null blocks, a re-announcement names them
            )
        tail = _tail(state, p, kind_of(p))
        if not all(held(_group(p), h) for h in p.block_hashes[-tail:]):
            return False
    return True


async def _held_before(
    index: IndexBackend,
    worker_id: str,
    state: WorkerState,
    events: Sequence[object],
    cands: list[tuple[int, list[int]]],
) -> dict[int, set[EngineHash]]:
    """Per group, the candidates' hashes the worker held on GPU before the batch: each
    candidate's blocks looked up (``resolve``) and their membership read (``fetch``)."""
    member: dict[int, set[EngineHash]] = {}
    for i, partners in cands:
        stores = [events[j] for j in (i, *partners)]
        by_size: dict[int, list[EngineHash]] = {}
        owners: list[tuple[int, int, list[EngineHash]]] = []
        for ev in stores:
            assert isinstance(ev, BlockStored)
            g = _group(ev)
            meta = state.groups.get(g)
            if meta is None:
                continue
            hashes = list(ev.block_hashes)
            by_size.setdefault(meta.block_size, hashes)
            owners.append((g, meta.block_size, hashes))
        if not owners:
            continue
        keys_by_size: dict[int, list[BlockKey]] = {}
        for bs, hashes in by_size.items():
            found = await index.resolve(worker_id, bs, hashes, live_only=True)
            if all(k is None for k in found):
                continue
            # An unknown hash gets a key no block has (the chain never yields 0 in
            # practice); it reads as a miss.
            keys_by_size[bs] = [0 if k is None else k for k in found]
        if not keys_by_size:
            continue
        snap = (await index.fetch([worker_id], keys_by_size)).get(worker_id)
        if snap is None:
            continue
        for g, bs, hashes in owners:
            mask = snap.masks.get(g, b"")
            if bs not in keys_by_size or by_size[bs] != hashes:
                continue
            got = member.setdefault(g, set())
            got.update(h for h, m in zip(hashes, mask, strict=False) if m & GPU_BIT)
    return member
