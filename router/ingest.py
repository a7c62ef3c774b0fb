"""Write side: apply decoded KV event batches to an index backend.

A batch goes through two passes and at most three backend calls: collect the engine
hashes the batch cannot resolve by itself (parents stored earlier, token-less offload
stores), ``resolve`` them, then turn every event into a keyed operation in order and hand
the list to ``apply`` (one Redis round trip). Learned metadata (group kind / block size /
window, hash mode) is saved first, when it changed, so blocks never exist in the backend
without the metadata needed to score them.

Bad input is counted, never raised: an event with an unknown medium, a token count that
does not match its blocks, or a store whose parent was never seen (``unknown_parent``;
its key cannot be computed, so it is not guessed). Only ``IndexUnavailable`` escapes, so
the transport can retry the batch (every operation is idempotent).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, fields

from router.hash_modes import (
    chain_keys,
    detect_engine_hash,
    key_bytes,
    root_digest,
    split_extra_keys,
)
from router.index.base import (
    MEDIUM_BITS,
    BlockKey,
    ClearOp,
    EngineHash,
    GroupMeta,
    IndexBackend,
    Op,
    RemoveOp,
    StoreOp,
    WorkerState,
)
from router.sglang_hashing import detect_sglang_hash
from schemas import (
    MEDIUM_GPU,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    normalise_medium,
)
from schemas.rest import GroupInfo

log = logging.getLogger(__name__)


@dataclass
class IngestCounters:
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
    unresolved_blocks: int = 0  # token-less blocks whose hash the map does not know
    bad_events: int = 0  # unknown medium, token/block count mismatch, bad block size
    group_changes: int = 0  # a group's kind/size/window changed
    worker_clears: int = 0  # clear_worker calls (resyncs)

    def as_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


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
        self._warned: set[str] = set()

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
        self.counters.worker_clears += 1
        if state.hash_mode != "unknown":
            state.hash_mode = "unknown"
            await self.index.save_worker(worker_id, state)

    async def remove_worker(self, worker_id: str) -> None:
        """Entries, maps and metadata gone (``DELETE /v1/workers/{id}``)."""
        self._states.pop(worker_id, None)
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

    def _bad(self, why: str) -> None:
        self.counters.bad_events += 1
        if why not in self._warned:
            self._warned.add(why)
            log.warning("skipping bad KV event: %s (counted in bad_events; logged once)", why)

    def _learn(self, state: WorkerState, ev: BlockStored, ops: list[Op]) -> GroupMeta | None:
        g = ev.group_idx if ev.group_idx is not None else 0
        bs = ev.block_size
        if not isinstance(bs, int) or bs <= 0:
            if self.default_block_size is None:
                return None
            bs = self.default_block_size
        old = state.groups.get(g)
        kind = ev.kv_cache_spec_kind or (old.kind if old is not None else self.default_kind)
        window = ev.kv_cache_spec_sliding_window
        if window is None and old is not None and old.kind == kind:
            window = old.sliding_window
        if (
            old is not None
            and old.kind == kind
            and old.block_size == bs
            and old.sliding_window == window
        ):
            return old
        meta = GroupMeta(kind, bs, window)
        if old is not None:
            self.counters.group_changes += 1
            if old.block_size != bs:
                ops.append(ClearOp())  # a new model behind the worker: old keys are void
        state.groups[g] = meta
        return meta

    async def apply_batch(self, worker_id: str, batch: KVEventBatch) -> None:
        """Apply a batch's events in order; problems are counted, never raised."""
        await self.apply_batches([(worker_id, batch)])

    async def apply_batches(self, items: Sequence[tuple[str, KVEventBatch]]) -> None:
        """Apply several batches (any workers) in order with one backend write call.

        For Redis that is one pipelined round trip for all of them, so a subscriber that
        drains what it has received so far overlaps its work with the server's.
        """
        plans: list[tuple[str, dict[int, GroupMeta], list[Op]]] = []
        carried: dict[str, dict[int, dict[EngineHash, BlockKey]]] = {}
        for worker_id, batch in items:
            known = carried.setdefault(worker_id, {})
            groups, ops = await self._plan(worker_id, batch, known)
            if ops:
                plans.append((worker_id, groups, ops))
        if not plans:
            return
        c = self.counters
        for result in await self.index.apply_many(plans):
            c.blocks_stored += result.stored
            c.blocks_stored_repeat += result.stored_repeat
            c.blocks_removed += result.removed
            c.blocks_removed_missing += result.removed_missing

    async def _plan(
        self, worker_id: str, batch: KVEventBatch, known: dict[int, dict[EngineHash, BlockKey]]
    ) -> tuple[dict[int, GroupMeta], list[Op]]:
        """A batch as keyed operations; ``known`` carries mappings between batches."""
        c = self.counters
        c.batches += 1
        state = await self._state(worker_id)
        before = (dict(state.groups), state.hash_mode)

        # Pass 1: engine hashes this batch needs from the map.
        wanted: dict[int, set[EngineHash]] = {}
        for ev in batch.events:
            if isinstance(ev, BlockStored):
                if not ev.token_ids or normalise_medium(ev.medium) != MEDIUM_GPU:
                    # Offload-tier stores copy blocks the map usually names already, even
                    # when their parent has gone from every tier since.
                    wanted.setdefault(ev.block_size, set()).update(ev.block_hashes)
                if ev.token_ids and ev.parent_block_hash is not None:
                    wanted.setdefault(ev.block_size, set()).add(ev.parent_block_hash)
        for bs, hashes in wanted.items():
            local = known.setdefault(bs, {})
            hs = [h for h in hashes if h not in local]
            if hs:
                found = await self.index.resolve(worker_id, bs, hs)
                local.update((h, k) for h, k in zip(hs, found, strict=True) if k is not None)

        # Pass 2: keyed operations, in order.
        ops: list[Op] = []
        for ev in batch.events:
            if isinstance(ev, BlockStored):
                c.events_stored += 1
                self._store(state, ev, known, ops)
            elif isinstance(ev, BlockRemoved):
                c.events_removed += 1
                g = ev.group_idx if ev.group_idx is not None else 0
                bit = MEDIUM_BITS.get(normalise_medium(ev.medium) or "")
                if bit is None:
                    self._bad(f"unknown medium {ev.medium!r}")
                elif g not in state.groups:
                    c.blocks_removed_missing += len(ev.block_hashes)
                else:
                    ops.append(RemoveOp(g, bit, list(ev.block_hashes)))
            elif isinstance(ev, AllBlocksCleared):
                c.events_cleared += 1
                ops.append(ClearOp())
                known.clear()
                state.hash_mode = "unknown"
            else:
                c.events_unknown += 1

        if (state.groups, state.hash_mode) != before:
            await self.index.save_worker(worker_id, state)
        return dict(state.groups), ops

    def _store(
        self,
        state: WorkerState,
        ev: BlockStored,
        known: dict[int, dict[EngineHash, BlockKey]],
        ops: list[Op],
    ) -> None:
        c = self.counters
        hashes = ev.block_hashes
        n = len(hashes)
        bit = MEDIUM_BITS.get(normalise_medium(ev.medium) or "")
        if bit is None:
            self._bad(f"unknown medium {ev.medium!r}")
            return
        meta = self._learn(state, ev, ops)
        if meta is None:
            self._bad(f"invalid block_size {ev.block_size!r}")
            return
        if n == 0:
            return
        bs = meta.block_size
        local = known.setdefault(bs, {})
        g = ev.group_idx if ev.group_idx is not None else 0
        tokens = ev.token_ids
        if tokens and len(tokens) != n * bs:
            self._bad("token_ids length is not len(block_hashes) * block_size")
            return
        keys = list(map(local.get, hashes))
        if None not in keys:  # the map (or a group of this block size) named them all
            ops.append(StoreOp(g, bit, list(hashes), keys))
            return
        parent_hash = ev.parent_block_hash
        parent: bytes | None = None
        others = None
        if tokens and parent_hash is None:
            extra = split_extra_keys(ev.extra_keys, n, ev.lora_name)
            # vLLM carries the salt in extra_keys, SGLang as a field of the event.
            salt = extra.cache_salt if extra.cache_salt is not None else ev.cache_salt
            parent = root_digest(extra.lora_name, salt)
            others = extra.others
            if state.hash_mode == "unknown":
                first = ev.extra_keys[0] if ev.extra_keys else None
                vllm = detect_engine_hash(hashes[0], tokens[:bs], first) is not None
                if vllm or detect_sglang_hash(hashes[0], tokens[:bs], ev.cache_salt):
                    state.hash_mode = "engine"
                elif ev.lora_name is None:  # SGLang LoRA chains: decide on a later chain
                    state.hash_mode = "canonical"
        elif tokens:
            parent_key = local.get(parent_hash)
            if parent_key is not None:
                parent = key_bytes(parent_key)
                others = split_extra_keys(ev.extra_keys, n, ev.lora_name).others
        if parent is None:
            # No tokens (vLLM's offload connector) or a parent never seen: only blocks the
            # map already names can be placed; the rest is counted, not guessed.
            hs = [h for h, k in zip(hashes, keys, strict=True) if k is not None]
            if tokens:
                c.unknown_parent += n - len(hs)
            else:
                c.unresolved_blocks += n - len(hs)
            if hs:
                ops.append(StoreOp(g, bit, hs, [k for k in keys if k is not None]))
            return
        keys = chain_keys(parent, tokens, bs, n, others)
        local.update(zip(hashes, keys, strict=True))
        ops.append(StoreOp(g, bit, list(hashes), keys))
