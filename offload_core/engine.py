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

import argparse
import logging
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass

from offload_core.base import (
    OffloadKey,
    ReqContext,
    get_offload_block_hash,
    get_offload_group_idx,
)
from offload_core.cpu import CPUOffloadingManager
from offload_core.engine_events import TierEventTranslator
from offload_core.groups import format_groups, parse_groups
from offload_core.hashing import HASH_ALGOS, external_hash
from offload_core.hit_rule import GroupSpec
from offload_core.kv_cache import KVCacheManager, RequestTooLargeError
from offload_core.transfer import KVBuffers, TransferWorker
from publisher import EventPublisher, NullEventPublisher
from schemas import MEDIUM_CPU, MEDIUM_GPU, KVEvent, KVEventBatch

log = logging.getLogger("kvroute.engine")

__all__ = ["EngineConfig", "RequestResult", "RequestTooLargeError", "SimEngine", "main"]


@dataclass(slots=True)
class EngineConfig:
    worker_id: str = "engine-0"
    groups: str = "full:16"
    gpu_blocks: int = 1024
    cpu_blocks: int = 4096
    hash_algo: str = "sha256"
    cpu_policy: str = "lru"
    num_heads: int = 2
    head_dim: int = 8
    device: str | None = None
    verify_loads: bool = True


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
        self.kv = KVCacheManager(self.groups, config.gpu_blocks, config.hash_algo)
        self.buffers = KVBuffers(
            self.groups,
            config.gpu_blocks,
            config.cpu_blocks,
            config.num_heads,
            config.head_dim,
            device=config.device,
        )
        self.cpu: CPUOffloadingManager | None = None
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
    ) -> RequestResult:
        """Prefill one prompt: hit, load back, offload + evict, compute, cache, publish."""
        kv, cpu, ctx = self.kv, self.cpu, self._ctx
        request = kv.make_request(token_ids, cache_salt, lora_name)
        lower = None if cpu is None else (lambda key: cpu.lookup(key, ctx) is True)
        try:
            plan = kv.begin(request, lower)
        except RequestTooLargeError:
            self.stats.rejected += 1
            raise
        load_keys = [k for gp in plan.groups for k in gp.pending.values() if k is not None]
        load_spec = None
        if load_keys:
            assert cpu is not None
            load_spec = cpu.prepare_load(load_keys, ctx)  # pinned: never evicted meanwhile
            cpu.touch(load_keys, ctx)
        offloaded = self._offload(kv.pool.eviction_candidates(plan.num_new_blocks))
        kv.allocate(plan)
        self._events += kv.pool.take_events()
        if load_keys:
            assert self.transfer is not None and load_spec is not None
            loads = plan.loads()
            self.transfer.load(load_keys, load_spec, [bid for _, bid in loads], ctx)
            self.transfer.wait()
            if self.config.verify_loads:
                self._verify_loaded(loads)
        computed = plan.computed()
        for g, (bids, digests) in _by_group(computed).items():
            self.buffers.write(g, bids, digests)
        kv.commit(plan)
        kv.finish(plan)
        self._events += kv.pool.take_events()
        self._publish()
        s = self.stats
        s.requests += 1
        s.prompt_tokens += len(token_ids)
        s.cached_tokens += plan.hit.hit_tokens
        s.gpu_cached_tokens += plan.hit.gpu_hit_tokens
        s.loaded_blocks += len(load_keys)
        s.offloaded_blocks += offloaded
        s.computed_blocks += len(computed)
        return RequestResult(
            len(token_ids),
            plan.hit.hit_tokens,
            plan.hit.gpu_hit_tokens,
            len(load_keys),
            offloaded,
            len(computed),
        )

    def reset_prefix_cache(self) -> bool:
        """Drop both tiers (``AllBlocksCleared`` clears every entry of a worker)."""
        if not self.kv.reset():
            return False
        self._new_cpu_tier()
        self._tier_events.clear()
        self._events += self.kv.pool.take_events()
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
        self.transfer = TransferWorker(self.buffers, self.cpu)

    def _offload(self, candidates: list[int]) -> int:
        """Store the cached blocks about to be evicted on the CPU tier; returns how many
        were copied. Too many for the CPU tier: the most recently freed ones go."""
        cpu, transfer, pool, ctx = self.cpu, self.transfer, self.kv.pool, self._ctx
        if cpu is None or transfer is None or not candidates:
            return 0
        candidates = candidates[-cpu.num_blocks :]
        by_key = {pool.blocks[b].key: b for b in candidates}
        keys = [k for k in by_key if k is not None]
        out = cpu.prepare_store(keys, ctx)
        if out is None:  # the CPU tier is pinned by loads: these blocks are just dropped
            self.stats.offload_skipped_blocks += len(keys)
            self._drain_cpu_events()
            return 0
        for key in out.keys_to_store:
            self._tier_events.remember(key, pool.blocks[by_key[key]].meta)
        if out.keys_to_store:
            gpu_ids = [by_key[k] for k in out.keys_to_store]
            transfer.store(out.keys_to_store, gpu_ids, out.store_spec, ctx)
            transfer.wait()  # the slots are reused right after this
        self._drain_cpu_events()
        return len(out.keys_to_store)

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
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="kvroute engine",
        description="Run a simulated engine worker that serves /v1/completions and "
        "publishes vLLM-format KV events (prefix caching, hybrid groups, CPU offload).",
    )
    add = p.add_argument
    add("--host", default="127.0.0.1", help="HTTP bind address (default loopback only)")
    add("--port", type=int, default=8100, help="HTTP port for /v1/completions")
    add("--worker-id", default="engine-0", help="worker id, also the default topic suffix")
    add(
        "--publish",
        default="tcp://*:5557",
        help="KV event PUB endpoint; vLLM's rule: a wildcard host (*) binds, a concrete "
        "host connects ('' disables)",
    )
    add(
        "--replay",
        default="tcp://127.0.0.1:5558",
        help="replay ROUTER endpoint, always bound (default loopback only; '' disables)",
    )
    add("--topic", default=None, help="ZMQ topic (default kv@<worker-id>)")
    add("--gpu-blocks", type=int, default=1024, help="GPU KV cache blocks")
    add("--cpu-blocks", type=int, default=4096, help="CPU offload blocks; 0 disables offloading")
    add("--groups", default="full:16", help="KV cache groups, e.g. full:16,swa:16:1024,mamba:16")
    add(
        "--hash",
        dest="hash_algo",
        choices=HASH_ALGOS,
        default="sha256",
        help="block hash algorithm (as vLLM's --prefix-caching-hash-algo)",
    )
    add("--cpu-policy", choices=("lru", "arc"), default="lru", help="CPU tier eviction policy")
    add("--num-heads", type=int, default=2, help="KV heads of the simulated model")
    add("--head-dim", type=int, default=8, help="head dimension of the simulated model")
    add("--device", default=None, help="torch device (default: cuda if present)")
    add(
        "--log-level",
        default="info",
        choices=("debug", "info", "warning", "error"),
        help="log level",
    )
    return p


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    from offload_core.engine_app import run_server

    config = EngineConfig(
        worker_id=args.worker_id,
        groups=args.groups,
        gpu_blocks=args.gpu_blocks,
        cpu_blocks=args.cpu_blocks,
        hash_algo=args.hash_algo,
        cpu_policy=args.cpu_policy,
        num_heads=args.num_heads,
        head_dim=args.head_dim,
        device=args.device,
    )
    topic = args.topic if args.topic is not None else f"kv@{args.worker_id}"
    try:
        parse_groups(config.groups)
    except ValueError as exc:
        print(f"kvroute engine: {exc}", file=sys.stderr)
        return 2
    return run_server(config, args.host, args.port, args.publish, args.replay or None, topic)
