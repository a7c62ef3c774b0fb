"""Write side: apply decoded KV event batches to an index backend. (facade; filling in)"""

from __future__ import annotations

from dataclasses import dataclass, fields

from router.index.base import IndexBackend
from schemas import KVEventBatch
from schemas.rest import GroupInfo


@dataclass
class IngestCounters:
    """Plain counters; the transport exports them as Prometheus metrics."""

    batches: int = 0
    events_stored: int = 0
    events_removed: int = 0
    events_cleared: int = 0
    events_unknown: int = 0
    blocks_stored: int = 0
    blocks_stored_repeat: int = 0
    blocks_removed: int = 0
    blocks_removed_missing: int = 0
    unknown_parent: int = 0
    unresolved_blocks: int = 0
    bad_events: int = 0
    group_changes: int = 0

    def as_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


class Ingestor:
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

    async def apply_batch(self, worker_id: str, batch: KVEventBatch) -> None:
        raise NotImplementedError

    async def clear_worker(self, worker_id: str) -> None:
        raise NotImplementedError

    async def remove_worker(self, worker_id: str) -> None:
        raise NotImplementedError

    async def worker_groups(self, worker_id: str) -> dict[int, GroupInfo]:
        raise NotImplementedError

    async def hash_mode(self, worker_id: str) -> str:
        raise NotImplementedError
