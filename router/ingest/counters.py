"""Ingest counters: plain ints the metrics collector exports as ``kvroute_ingest_*``
(``IngestCounters``) and per worker (``WorkerCounters``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from schemas.counters import CounterSet

if TYPE_CHECKING:
    from router.index.base import ApplyResult


@dataclass
class IngestCounters(CounterSet):
    """Plain counters; the transport exports them as Prometheus metrics."""

    batches: int = 0
    events_stored: int = 0
    events_removed: int = 0
    events_cleared: int = 0
    events_unknown: int = 0  # event objects of a type the ingestor does not know
    blocks_stored: int = 0  # (worker, group, key, medium) entries newly set
    blocks_stored_repeat: int = 0  # idempotent repeats
    blocks_removed: int = 0
    blocks_removed_missing: int = 0  # removal of an entry not held (repeat or never seen)
    unknown_parent: int = 0  # blocks not indexed: parent hash never seen
    # vLLM partial entries never indexed: the units of their block before them were in
    # no event, and no later store named their hash (docs/vllm.md)
    partial_unknown_prefix: int = 0
    partial_late: int = 0  # partial entries indexed once a later store named their hash
    unresolved_blocks: int = 0  # token-less blocks whose hash the map does not know
    bad_events: int = 0  # unknown medium, token/block count mismatch, bad block size
    bad_groups: int = 0  # events with a negative or non-integer group_idx
    unplaced_blocks: int = 0  # sparse-store blocks whose position contradicts the map
    sparse_stores: int = 0  # stores listing fewer blocks than their tokens hold
    partial_stores: int = 0  # partial entries (block_size below the group's)
    group_changes: int = 0  # a group's kind/size/window changed
    hash_unit_changes: int = 0  # a smaller block size showed the learned unit was wrong
    worker_clears: int = 0  # clear_worker calls (resyncs)
    batches_skipped: int = 0  # batches the index had applied already (seq guard)
    # batches left to the router rebuilding the worker: not after the index's last seq
    batches_deferred: int = 0
    reannounced_blocks: int = 0  # kv_cache_report_mode "full" re-announcements (no copy)

    def count_applied(self, result: ApplyResult) -> bool:
        """Add what one index write did; True when it deferred batches."""
        self.blocks_stored += result.stored
        self.blocks_stored_repeat += result.stored_repeat
        self.blocks_removed += result.removed
        self.blocks_removed_missing += result.removed_missing
        self.batches_skipped += result.skipped_batches
        self.batches_deferred += result.deferred_batches
        return result.deferred_batches > 0


@dataclass
class WorkerCounters(CounterSet):
    """Plain ints, read by the metrics collector and ``/v1/workers``."""

    batches: int = 0
    events: int = 0
    gaps: int = 0
    replays: int = 0
    replay_failures: int = 0
    resyncs: int = 0
    decode_errors: int = 0
    duplicates: int = 0
    ingest_retries: int = 0
    ingest_errors: int = 0
    tail_checks: int = 0  # idle-time replay asks for frames lost at the tail
    replay_overflows: int = 0
    task_restarts: int = 0
    reopened: int = 0  # connections libzmq ended for good, connected again
