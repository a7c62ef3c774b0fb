"""The engine hashes a batch needs but does not name itself, looked up in the index.

Split from ``router.ingest.ingestor`` (its general path's first step); the fast path
(``router.ingest.fast_path``) does the same lookup for the batches it takes.
"""

from __future__ import annotations

from router.index.base import BlockKey, EngineHash, IndexBackend, WorkerState
from router.ingest.learning import block_size as _size
from schemas import MEDIUM_GPU, BlockStored, KVEventBatch, normalise_medium


async def resolve_parents(
    index: IndexBackend,
    worker_id: str,
    state: WorkerState,
    batch: KVEventBatch,
    known: dict[EngineHash, BlockKey],
    default_block_size: int | None,
) -> None:
    """Look up, in every map of the worker, the engine hashes the batch needs."""
    wanted: set[EngineHash] = set()
    sizes = {m.block_size for m in state.groups.values()}
    partials = state.settings.partial_hash_hits
    for ev in batch.events:
        if not isinstance(ev, BlockStored):
            continue
        bs = _size(ev.block_size) or default_block_size
        if bs is not None:
            sizes.add(bs)
        tokens = ev.token_ids
        if not tokens or normalise_medium(ev.medium) != MEDIUM_GPU:
            # Offload-tier stores copy blocks the map usually names already, even
            # when their parent has gone from every tier since.
            wanted.update(ev.block_hashes)
            continue
        if ev.parent_block_hash is not None:
            wanted.add(ev.parent_block_hash)
        if bs is not None and len(ev.block_hashes) * bs != len(tokens):
            wanted.update(ev.block_hashes)  # a sparse store: anchors for placement
        elif partials and bs == state.hash_unit:
            wanted.update(ev.block_hashes)  # a partial entry another group keyed
    todo = [h for h in wanted if h not in known]
    for bs in sorted(sizes):
        if not todo:
            break
        found = await index.resolve(worker_id, bs, todo)
        known.update((h, k) for h, k in zip(todo, found, strict=True) if k is not None)
        todo = [h for h, k in zip(todo, found, strict=True) if k is None]
