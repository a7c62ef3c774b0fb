"""A simulated engine worker: real cache bookkeeping, real KV bytes, real KV events.

``SimEngine`` serves one prompt at a time the way a vLLM worker with prefix caching and
CPU offloading would, minus the model: it finds the hybrid hit over GPU blocks and
offloaded CPU blocks (``KVCacheManager``), loads CPU blocks back, writes deterministic KV
values for the blocks it "computes", and under pressure stores the blocks about to be
evicted to the CPU tier before their slots are reused. Every change is published as a
vLLM-format event batch, one per request, so that replaying the stream reproduces the
(group, medium, hash) set the engine holds.

``kvroute engine`` (``main``) serves it over HTTP; see ``offload_core.engine_app``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import cast

from offload_core.base import (
    OffloadKey,
    ReqContext,
    get_offload_block_hash,
    get_offload_group_idx,
    make_offload_key,
)
from offload_core.block_pool import lora_id_for
from offload_core.cpu import CPULoadStoreSpec, CPUOffloadingManager, FilteredOffloadingManager
from offload_core.engine_events import TierEventTranslator
from offload_core.groups import format_groups, parse_groups
from offload_core.transfer import KVBuffers, TransferWorker
from offload_core.vcache import VKVCacheManager, VRequest
from offload_core.vpool import VBlock
from offload_core.vsched import RequestTooLargeError, serve_request
from publisher import EventPublisher, NullEventPublisher
from schemas import MEDIUM_CPU, MEDIUM_GPU, KVEvent, KVEventBatch
from schemas.hashing import HASH_ALGOS, external_hash
from schemas.hit_rule import GroupSpec, longest_hit

log = logging.getLogger("kvroute.engine")

__all__ = ["EngineConfig", "RequestResult", "RequestTooLargeError", "SimEngine"]


@dataclass(slots=True)
class EngineConfig:
    worker_id: str = "engine-0"
    groups: str = "full:16"
    gpu_blocks: int = 1024
    cpu_blocks: int = 4096
    hash_algo: str = "sha256"
    cpu_policy: str = "lru"
    # vLLM's ``store_threshold`` (kv_connector_extra_config): a block goes to the CPU tier
    # only from its N-th offer; below 2 every offered block is stored.
    cpu_store_threshold: int = 0
    num_heads: int = 2
    head_dim: int = 8
    device: str | None = None
    verify_loads: bool = True
    hash_block_size: int | None = None  # None: vLLM's default (gcd of the block sizes)
    eagle: bool = False
    retention_interval: int | None = None


@dataclass(slots=True)
class RequestResult:
    prompt_tokens: int
    cached_tokens: int  # hit on any tier (what vLLM reports)
    gpu_cached_tokens: int  # the part of the hit already on GPU
    loaded_blocks: int  # CPU -> GPU
    offloaded_blocks: int  # GPU -> CPU before eviction
    computed_blocks: int  # full blocks written and cached


@dataclass(slots=True)
class EngineStats:
    requests: int = 0
    rejected: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    gpu_cached_tokens: int = 0
    loaded_blocks: int = 0
    offloaded_blocks: int = 0
    offload_skipped_blocks: int = 0
    computed_blocks: int = 0
    load_verify_failures: int = 0
    events: int = 0
    batches: int = 0
    resets: int = 0


class SimEngine:
    """Composes the KV cache manager, the CPU tier, the data path and the publisher.

    Not thread-safe: callers serialise requests (the HTTP app holds a lock), which also
    keeps the published event order exact.
    """

    def __init__(self, config: EngineConfig, publisher: EventPublisher | None = None) -> None:
        if config.hash_algo not in HASH_ALGOS:
            raise ValueError(f"unknown hash algorithm {config.hash_algo!r}")
        self.config = config
        self.groups: list[GroupSpec] = parse_groups(config.groups)
        self.publisher = publisher if publisher is not None else NullEventPublisher()
        self.kv = VKVCacheManager(
            self.groups,
            config.gpu_blocks,
            hash_block_size=config.hash_block_size,
            eagle=config.eagle,
            retention_interval=config.retention_interval,
        )
        self.kv.pool.on_evict = self._offload
        self._seq = 0
        self._offloaded = 0
        self.buffers = KVBuffers(
            self.groups,
            config.gpu_blocks,
            config.cpu_blocks,
            config.num_heads,
            config.head_dim,
            device=config.device,
        )
        self.cpu: CPUOffloadingManager | FilteredOffloadingManager | None = None
        self.transfer: TransferWorker | None = None
        self._new_cpu_tier()
        self.stats = EngineStats()
        self._ctx = ReqContext()
        self._events: list[KVEvent] = []
        self._tier_events = TierEventTranslator(self.groups)

    # ------------------------------------------------------------------ serving
    def serve(
        self,
        token_ids: Sequence[int],
        cache_salt: str | None = None,
        lora_name: str | None = None,
        max_tokens: int = 1,
        output: Sequence[int] = (),
    ) -> RequestResult:
        """Prefill one prompt the way vLLM's scheduler and cache manager would (hit,
        CPU load-back as external tokens, mamba-aligned chunks), then decode
        ``max_tokens - 1`` tokens (``output``'s, where given), free, publish."""
        self._seq += 1
        req = VRequest(
            f"req-{self._seq}",
            list(token_ids),
            len(token_ids),
            self.kv.hash_block_size,
            self.config.hash_algo,
            lora_name=lora_name,
            lora_path=None if lora_name is None else f"lora://{lora_name}",
            lora_id=lora_id_for(lora_name),
            cache_salt=cache_salt,
        )
        self._offloaded = 0
        try:
            run = serve_request(
                self.kv, req, self._external_hit, max_tokens, self._after_alloc, output
            )
        except RequestTooLargeError:
            self.stats.rejected += 1
            self._collect()
            self._publish()
            raise
        self._collect()
        self._publish()
        s = self.stats
        s.requests += 1
        s.prompt_tokens += len(token_ids)
        s.cached_tokens += run.cached_tokens
        s.gpu_cached_tokens += run.local_tokens
        s.loaded_blocks += run.loaded
        s.offloaded_blocks += self._offloaded
        s.computed_blocks += run.computed
        return RequestResult(
            len(token_ids),
            run.cached_tokens,
            run.local_tokens,
            run.loaded,
            self._offloaded,
            run.computed,
        )

    def reset_prefix_cache(self) -> bool:
        """Drop both tiers (``AllBlocksCleared`` clears every entry of a worker)."""
        if not self.kv.reset_prefix_cache():
            return False
        self._new_cpu_tier()
        self._tier_events.clear()
        self._collect()
        self._publish()
        self.stats.resets += 1
        log.info("worker %s: prefix cache reset (GPU and CPU tiers)", self.config.worker_id)
        return True

    def shutdown(self) -> None:
        if self.transfer is not None:
            self.transfer.wait()
        self.publisher.shutdown()

    # --------------------------------------------------------------- inspection
    def state(self) -> set[tuple[int, str, int]]:
        """``(group, medium, external hash)`` of every block the engine holds."""

        def entry(key: OffloadKey, medium: str) -> tuple[int, str, int]:
            return (get_offload_group_idx(key), medium, external_hash(get_offload_block_hash(key)))

        out = {entry(k, MEDIUM_GPU) for k in self.kv.pool.cached_keys()}
        if self.cpu is not None:
            out |= {entry(k, MEDIUM_CPU) for k in self.cpu.ready_keys()}
        return out

    def stats_dict(self) -> dict[str, object]:
        pool = self.kv.pool
        out: dict[str, object] = dict(asdict(self.stats))
        out |= {
            "worker_id": self.config.worker_id,
            "groups": format_groups(self.groups),
            "gpu_blocks": pool.num_blocks,
            "gpu_cached_blocks": pool.num_cached_blocks,
            "gpu_evictions": pool.evictions,
            "cpu_blocks": self.config.cpu_blocks,
            "cpu_cached_blocks": 0 if self.cpu is None else len(self.cpu.ready_keys()),
            "cpu_stores_skipped": getattr(self.cpu, "stores_skipped", 0),
            "device": str(self.buffers.device),
            "publisher": self.publisher.counters(),
        }
        if self.transfer is not None:
            out["transfer"] = asdict(self.transfer.stats)
        return out

    # ------------------------------------------------------------------ helpers
    def _new_cpu_tier(self) -> None:
        cfg = self.config
        if cfg.cpu_blocks <= 0:
            return
        self.cpu = CPUOffloadingManager(cfg.cpu_blocks, cfg.cpu_policy)
        if cfg.cpu_store_threshold >= 2:
            self.cpu = FilteredOffloadingManager(self.cpu, cfg.cpu_store_threshold)
        self.transfer = TransferWorker(self.buffers, self.cpu)

    def _offload(self, doomed: list[VBlock]) -> None:
        """Store the keyed blocks an allocation is about to evict on the CPU tier (the
        pool calls this before reusing their slots). Too many for the CPU tier: the
        most recently freed ones go."""
        cpu, transfer, pool, ctx = self.cpu, self.transfer, self.kv.pool, self._ctx
        if cpu is None or transfer is None or not doomed:
            return
        doomed = doomed[-cpu.num_blocks :]
        by_key = {b.key: b for b in doomed if b.key is not None}
        keys = list(by_key)
        out = cpu.prepare_store(keys, ctx)
        if out is None:  # the CPU tier is pinned by loads: these blocks are just dropped
            self.stats.offload_skipped_blocks += len(keys)
            self._drain_cpu_events()
            return
        for key in out.keys_to_store:
            self._tier_events.remember(key, pool.meta.get(by_key[key].block_id))
        if out.keys_to_store:
            gpu_ids = [by_key[k].block_id for k in out.keys_to_store]
            spec = cast(CPULoadStoreSpec, out.store_spec)  # the CPU manager's
            transfer.store(out.keys_to_store, gpu_ids, spec, ctx)
            transfer.wait()  # the slots are reused right after this
        self._drain_cpu_events()
        self._offloaded += len(out.keys_to_store)

    def _external_hit(self, req: VRequest, local: int) -> int:
        """Tokens the CPU tier adds beyond the GPU hit (loaded back as external tokens,
        like vLLM's offloading connector): the hit over blocks on GPU *or* CPU."""
        cpu, kv = self.cpu, self.kv
        if cpu is None:
            return 0
        limit = req.num_tokens - 1
        masks = []
        for g, spec in enumerate(self.groups):
            view = kv.pool._view(req.block_hashes, spec.block_size)
            masks.append(
                bytes(
                    kv.pool.get_cached_block(d, [g]) is not None
                    or cpu.lookup(make_offload_key(d, g), self._ctx) is True
                    for d in view[: limit // spec.block_size]
                )
            )
        total = longest_hit(req.num_tokens, self.groups, masks, eagle=kv.eagle, alignment=kv.step)
        return max(0, total - local)

    def _after_alloc(
        self, req: VRequest, local: int, external: int, first: bool
    ) -> tuple[int, int]:
        """Load external blocks from the CPU tier, then write every newly keyed block."""
        kv, cpu, ctx = self.kv, self.cpu, self._ctx
        loaded: dict[int, bytes] = {}
        loads: list[tuple[OffloadKey, int]] = []
        if first and external and cpu is not None and self.transfer is not None:
            total = local + external
            for g, m in enumerate(kv.managers):
                b = m.block_size
                view = kv.pool._view(req.block_hashes, b)
                table = m.req_blocks.get(req.request_id, [])
                for i in range(local // b, min(total // b, len(table))):
                    key = make_offload_key(view[i], g)
                    if not table[i].is_null and cpu.lookup(key, ctx) is True:
                        loads.append((key, table[i].block_id))
            if loads:
                keys = [k for k, _ in loads]
                spec = cast(CPULoadStoreSpec, cpu.prepare_load(keys, ctx))
                cpu.touch(keys, ctx)
                self.transfer.load(keys, spec, [bid for _, bid in loads], ctx)
                self.transfer.wait()
                if self.config.verify_loads:
                    self._verify_loaded(loads)
                loaded = {bid: get_offload_block_hash(k) for k, bid in loads}
        keyed, kv.pool.keyed = kv.pool.keyed, []
        computed = [(g, bid, d) for g, bid, d in keyed if loaded.get(bid) != d]
        for g, (bids, digests) in _by_group(computed).items():
            self.buffers.write(g, bids, digests)
        return len(loads), len(computed)

    def _collect(self) -> None:
        self._events += self.kv.take_events()
        self.kv.pool.keyed.clear()

    def _verify_loaded(self, loads: list[tuple[OffloadKey, int]]) -> None:
        """Check the loaded blocks hold their deterministic values (one compare per group;
        per block only to count a failure)."""
        blocks = [(get_offload_group_idx(k), bid, get_offload_block_hash(k)) for k, bid in loads]
        buf = self.buffers
        for g, (bids, digests) in _by_group(blocks).items():
            if buf.matches(g, bids, digests):
                continue
            bad = sum(not buf.matches(g, [b], [d]) for b, d in zip(bids, digests, strict=True))
            if self.stats.load_verify_failures == 0:
                log.error("%d blocks loaded back from CPU do not hold their KV values", bad)
            self.stats.load_verify_failures += bad

    def _drain_cpu_events(self) -> None:
        if self.cpu is None:
            return
        for ev in self.cpu.take_events():
            self._events += self._tier_events.translate(ev)

    def _publish(self) -> None:
        if not self._events:
            return
        events, self._events = self._events, []
        self.publisher.publish(KVEventBatch(ts=time.time(), events=events))
        self.stats.events += len(events)
        self.stats.batches += 1


def _by_group(
    blocks: Iterable[tuple[int, int, bytes]],
) -> dict[int, tuple[list[int], list[bytes]]]:
    """``(group, block id, digest)`` triples as per-group (block ids, digests), in order:
    the shape ``KVBuffers.write``/``matches`` take, one call per group."""
    out: dict[int, tuple[list[int], list[bytes]]] = {}
    for g, bid, digest in blocks:
        bids, digests = out.setdefault(g, ([], []))
        bids.append(bid)
        digests.append(digest)
    return out


# ---------------------------------------------------------------------- the CLI
