"""vLLM 0.33's ``KVCacheManager`` driven the way its scheduler drives it (one DP rank).

Why a re-implementation of the scheduler's loop and not vLLM's ``Scheduler``: that needs
a full ``VllmConfig`` (a model config from the Hub). Everything that decides what is
cached, hit, evicted or announced is vLLM's own code: ``KVCacheManager`` (lookup,
allocation, caching, freeing, events), the request block hasher, and the scheduler's own
``_mamba_block_aligned_split`` (called on a namespace holding the attributes it reads).
The loop around them follows ``Scheduler.schedule`` / ``update_from_output``; see
``conformance.workload`` for the step semantics.
"""

from __future__ import annotations

import math
import os
from collections import deque
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import torch
from vllm.distributed.kv_events import KVEventBatch, ZmqEventPublisher
from vllm.lora.request import LoRARequest
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import get_hash_fn_by_name
from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.core.kv_cache_utils import get_request_block_hasher
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheSpec,
    MambaSpec,
    MLAAttentionSpec,
    SlidingWindowSpec,
)
from vllm.v1.request import Request, RequestStatus

from conformance.workload import Action, GroupDef, Scenario

ProbeHook = Callable[[dict[str, Any]], None]


def _spec(g: GroupDef) -> KVCacheSpec:
    dt = torch.float16
    if g.kind == "full_attention":
        return FullAttentionSpec(block_size=g.block_size, num_kv_heads=1, head_size=64, dtype=dt)
    if g.kind == "sliding_window":
        assert g.sliding_window is not None
        return SlidingWindowSpec(
            block_size=g.block_size,
            num_kv_heads=1,
            head_size=64,
            dtype=dt,
            sliding_window=g.sliding_window,
        )
    if g.kind == "mla":
        return MLAAttentionSpec(block_size=g.block_size, num_kv_heads=1, head_size=64, dtype=dt)
    if g.kind == "mamba":
        return MambaSpec(
            block_size=g.block_size,
            shapes=((4, 64),),
            dtypes=(torch.float32,),
            mamba_cache_mode="align",
        )
    raise ValueError(f"unknown group kind {g.kind!r}")


def kv_cache_config(sc: Scenario) -> KVCacheConfig:
    groups = [
        KVCacheGroupSpec([f"layers.{i}"], _spec(g), is_eagle_group=sc.eagle)
        for i, g in enumerate(sc.groups)
    ]
    return KVCacheConfig(
        num_blocks=sc.num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=groups,
        prefix_cache_retention_interval=sc.retention_interval,
        hash_block_size=sc.unit,
    )


class RankEngine:
    """One DP rank: a real ``KVCacheManager`` plus the scheduler's bookkeeping around it."""

    def __init__(
        self, sc: Scenario, rank: int, publisher: ZmqEventPublisher, ts: Callable[[], float]
    ):
        self.sc = sc
        self.rank = rank
        self.publisher = publisher
        self.ts = ts
        self.block_size = math.lcm(*(g.block_size for g in sc.groups))
        hash_fn = get_hash_fn_by_name(sc.hash_algo)
        self.hasher = get_request_block_hasher(sc.unit, hash_fn)
        self.manager = KVCacheManager(
            kv_cache_config=kv_cache_config(sc),
            max_model_len=sc.max_model_len,
            scheduler_block_size=self.block_size,
            hash_block_size=sc.unit,
            enable_caching=True,
            use_eagle=sc.eagle,
            enable_kv_cache_events=True,
        )
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.outputs: dict[str, list[int]] = {}
        self.admitted: set[str] = set()
        has_mamba = any(g.kind == "mamba" for g in sc.groups)
        coord = self.manager.coordinator
        # The attributes Scheduler._mamba_block_aligned_split reads, set as the
        # scheduler's __init__ sets them, so vLLM's own split runs unchanged.
        self.split_self = SimpleNamespace(
            cache_config=SimpleNamespace(block_size=self.block_size),
            block_size=self.block_size,
            scheduler_config=SimpleNamespace(long_prefill_token_threshold=0),
            hash_block_size=sc.unit,
            use_eagle_block_drop=sc.eagle,
            num_hash_lookahead_tokens=0,
            max_num_scheduled_tokens=sc.token_budget,
            mamba_has_prefill_checkpoint_blocks=False,
            mamba_prefill_checkpoint_alignment=None,
            mamba_partial_cache_hit=has_mamba
            and sc.unit < self.block_size
            and coord.enable_partial_hash_hits,
            mamba_shared_prefix_checkpoint=False,
        )
        self.need_split = has_mamba
        self.partial_hash_hits = bool(coord.enable_partial_hash_hits)

    # ---------------------------------------------------------------- requests
    def add(self, a: Action, on_probe: ProbeHook) -> None:
        extra = {"kv_cache_report_mode": "full"} if a["report_full"] else None
        params = SamplingParams(
            max_tokens=a["max_tokens"],
            skip_reading_prefix_cache=a["skip_prefix_cache"] or None,
            extra_args=extra,
        )
        lora = None
        if a["lora_name"] is not None:
            lora = LoRARequest(a["lora_name"], 1 + sum(map(ord, a["lora_name"])), "/lora")
        req = Request(
            request_id=a["request_id"],
            prompt_token_ids=list(a["token_ids"]),
            sampling_params=params,
            pooling_params=None,
            lora_request=lora,
            cache_salt=a["cache_salt"],
            block_hasher=self.hasher,
        )
        self.outputs[req.request_id] = list(a["output_token_ids"])
        self.waiting.append(req)
        on_probe(self.probe(req))

    def probe(self, req: Request) -> dict[str, Any]:
        """vLLM's answer for ``req`` as it arrives: every earlier step's events are
        published and nothing changed since, so a router fed them can match it exactly.
        (An admission-time lookup happens mid-step, after that step's own allocations
        cached and evicted blocks whose events come at the step's end.) A "full"
        report-mode request would re-announce its hit on this extra lookup, so the
        mode is off for the probe: the lookup itself has no other side effect."""
        mode = req.kv_cache_report_mode
        req.kv_cache_report_mode = "incremental"
        try:
            _, hit, _ = self.manager.get_computed_blocks(req)
        finally:
            req.kv_cache_report_mode = mode
        return {
            "op": "probe",
            "dp_rank": self.rank,
            "request_id": req.request_id,
            "token_ids": list(req.all_token_ids),
            "lora_name": req.lora_request.lora_name if req.lora_request else None,
            "cache_salt": req.cache_salt,
            "skip_prefix_cache": bool(req.skip_reading_prefix_cache),
            "expected_hit_tokens": hit,
        }

    def abort(self, request_id: str) -> None:
        for req in list(self.waiting):
            if req.request_id == request_id:
                self.waiting.remove(req)
                self._finish(req, RequestStatus.FINISHED_ABORTED)
        for req in list(self.running):
            if req.request_id == request_id:
                self.running.remove(req)
                self._finish(req, RequestStatus.FINISHED_ABORTED)

    def _finish(self, req: Request, status: RequestStatus) -> None:
        req.status = status
        if req.request_id in self.admitted:
            self.manager.free(req)
        self.admitted.discard(req.request_id)

    @property
    def busy(self) -> bool:
        return bool(self.waiting or self.running)

    # ---------------------------------------------------------------- one step
    def _split(self, req: Request, n: int, hit: int = 0) -> int:
        if not self.need_split:
            return n
        return Scheduler._mamba_block_aligned_split(self.split_self, req, n, hit, 0)  # type: ignore[arg-type]

    def _preempt(self, victim: Request) -> None:
        self.manager.free(victim)
        self.admitted.discard(victim.request_id)
        victim.status = RequestStatus.PREEMPTED
        victim.num_computed_tokens = 0
        victim.num_preemptions += 1
        self.waiting.appendleft(victim)

    def step(self, on_probe: ProbeHook) -> None:
        """schedule -> outputs (append / finish+free) -> take_events -> publish."""
        self.manager.new_step_starts()
        budget = self.sc.token_budget
        scheduled: dict[str, int] = {}
        for req in list(self.running):
            if budget <= 0 or req not in self.running:
                continue
            n = min(req.num_tokens - req.num_computed_tokens, budget)
            n = self._split(req, n)
            if n <= 0:
                continue
            while True:
                blocks = self.manager.allocate_slots(req, n)
                if blocks is not None:
                    break
                victim = self.running.pop()
                scheduled.pop(victim.request_id, None)
                self._preempt(victim)
                if victim is req:
                    break
            if blocks is None:
                continue
            scheduled[req.request_id] = n
            budget -= n
        while self.waiting and budget > 0:
            req = self.waiting[0]
            hit_blocks, hit, boundary = self.manager.get_computed_blocks(req)
            req.shared_prefix_boundary = boundary
            on_probe(
                {
                    "op": "admit",
                    "dp_rank": self.rank,
                    "request_id": req.request_id,
                    "hit_tokens": hit,
                }
            )
            n = min(req.num_tokens - hit, budget)
            n = self._split(req, n, hit)
            if n <= 0:
                break
            blocks = self.manager.allocate_slots(
                req,
                n,
                num_new_computed_tokens=hit,
                new_computed_blocks=hit_blocks,
                has_scheduled_reqs=bool(self.running),
            )
            if blocks is None:
                break
            self.waiting.popleft()
            self.admitted.add(req.request_id)
            req.status = RequestStatus.RUNNING
            req.num_computed_tokens = hit
            self.running.append(req)
            scheduled[req.request_id] = n
            budget -= n
        # Drained every step as the scheduler does; copy-on-write sources/targets are
        # retained until the copy ran (here: at once, no async execution).
        self.manager.take_boundary_state_offloads()
        self.manager.take_new_block_ids()
        copies, retained = self.manager.take_kv_cache_block_copies()
        if copies:
            self.manager.block_pool.free_blocks(retained)
        for req in list(self.running):
            n = scheduled.get(req.request_id)
            if n is None:
                continue
            req.num_computed_tokens += n
            if req.num_computed_tokens < req.num_tokens:
                continue  # a prefill chunk: nothing sampled
            outs = self.outputs[req.request_id]
            req.append_output_token_ids(outs[req.num_output_tokens])
            if req.num_output_tokens >= len(outs):
                self.running.remove(req)
                self._finish(req, RequestStatus.FINISHED_STOPPED)
        events = self.manager.take_events()
        if events:
            self.publisher.publish(KVEventBatch(ts=self.ts(), events=events))


def worker_info(sc: Scenario) -> dict[str, Any]:
    """The engine settings a router needs beyond the events (the recording's ``worker``)."""
    from vllm.v1.core.kv_cache_coordinator import get_kv_cache_coordinator

    coord = get_kv_cache_coordinator(
        kv_cache_config=kv_cache_config(sc),
        max_model_len=sc.max_model_len,
        max_in_flight_tokens=sc.max_model_len,
        use_eagle=sc.eagle,
        num_hash_lookahead_tokens=0,
        enable_caching=True,
        enable_kv_cache_events=False,
        dcp_world_size=1,
        pcp_world_size=1,
        scheduler_block_size=math.lcm(*(g.block_size for g in sc.groups)),
        hash_block_size=sc.unit,
        metrics_collector=None,
        num_prefill_lookahead=0,
    )
    return {
        "hash_block_size": sc.unit,
        "eagle": sc.eagle,
        "partial_hash_hits": bool(coord.enable_partial_hash_hits),
        "hash_algo": sc.hash_algo,
        "pythonhashseed": os.environ.get("PYTHONHASHSEED"),
        "retention_interval": sc.retention_interval,
        "dp_ranks": sc.dp_ranks,
        "num_blocks": sc.num_blocks,
    }
