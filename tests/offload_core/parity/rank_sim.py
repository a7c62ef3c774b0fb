"""kvroute's cache core (``offload_core.vcache``) driven by the conformance workload's
actions exactly as ``conformance/vllm_engine.RankEngine`` drives vLLM's: the same
scheduler loop (running first, then waiting FCFS under a token budget, preemption of the
newest running request, mamba-aligned chunks, outputs appended after the step, finish
and free, one event batch per step). Only the cache manager differs, so any difference
in probes, admissions or frames is a difference between our engine and vLLM."""

from __future__ import annotations

from collections import deque
from typing import Any

from offload_core.vcache import VKVCacheManager, VRequest
from offload_core.vmamba import MambaManager
from offload_core.vsched import mamba_chunk
from schemas import KVEvent
from schemas.hit_rule import GroupSpec

KINDS = {"mla": "mla_attention"}


def groups_of(rec_groups: list[dict[str, Any]]) -> list[GroupSpec]:
    return [
        GroupSpec(KINDS.get(g["kind"], g["kind"]), g["block_size"], g["sliding_window"])
        for g in rec_groups
    ]


class RankSim:
    def __init__(self, groups: list[GroupSpec], worker: dict[str, Any], budget: int) -> None:
        self.kv = VKVCacheManager(
            groups,
            worker["num_blocks"],
            hash_block_size=worker["hash_block_size"],
            eagle=worker["eagle"],
            retention_interval=worker["retention_interval"],
        )
        self.algo = worker["hash_algo"]
        self.budget = budget
        self.waiting: deque[VRequest] = deque()
        self.running: list[VRequest] = []
        self.outputs: dict[str, list[int]] = {}
        self.num_output: dict[str, int] = {}
        self.admitted: set[str] = set()
        self.mamba = any(isinstance(m, MambaManager) for m in self.kv.managers)

    def add(self, a: dict[str, Any]) -> int:
        lora = a["lora_name"]
        req = VRequest(
            a["request_id"],
            list(a["token_ids"]),
            len(a["token_ids"]),
            self.kv.hash_block_size,
            self.algo,
            lora_name=lora,
            lora_path=None if lora is None else "/lora",
            lora_id=None if lora is None else 1 + sum(map(ord, lora)),
            cache_salt=a["cache_salt"],
            skip_prefix_cache=bool(a["skip_prefix_cache"]),
            report_full=bool(a["report_full"]),
        )
        self.outputs[req.request_id] = list(a["output_token_ids"])
        self.num_output[req.request_id] = 0
        self.waiting.append(req)
        full, req.report_full = req.report_full, False  # the probe re-announces nothing
        try:
            return self.kv.get_computed_blocks(req)[1]
        finally:
            req.report_full = full

    def abort(self, rid: str) -> None:
        for req in list(self.waiting):
            if req.request_id == rid:
                self.waiting.remove(req)
                self._finish(req)
        for req in list(self.running):
            if req.request_id == rid:
                self.running.remove(req)
                self._finish(req)

    def _finish(self, req: VRequest) -> None:
        if req.request_id in self.admitted:
            self.kv.free(req)
        self.admitted.discard(req.request_id)

    @property
    def busy(self) -> bool:
        return bool(self.waiting or self.running)

    def _split(self, req: VRequest, n: int, hit: int = 0) -> int:
        if not self.mamba:
            return n
        return mamba_chunk(self.kv, req, n, req.num_computed_tokens + hit)

    def _preempt(self, victim: VRequest) -> None:
        self.kv.free(victim)
        self.admitted.discard(victim.request_id)
        victim.num_computed_tokens = 0
        self.waiting.appendleft(victim)

    def step(self) -> tuple[list[tuple[str, int]], list[KVEvent]]:
        """One step; returns (hits at admission, events published)."""
        kv = self.kv
        kv.new_step_starts()
        budget = self.budget
        scheduled: dict[str, int] = {}
        admits: list[tuple[str, int]] = []
        for req in list(self.running):
            if budget <= 0 or req not in self.running:
                continue
            n = self._split(req, min(req.num_tokens - req.num_computed_tokens, budget))
            if n <= 0:
                continue
            ok = False
            while True:
                ok = kv.allocate_slots(req, n)
                if ok:
                    break
                victim = self.running.pop()
                scheduled.pop(victim.request_id, None)
                self._preempt(victim)
                if victim is req:
                    break
            if not ok:
                continue
            scheduled[req.request_id] = n
            budget -= n
        while self.waiting and budget > 0:
            req = self.waiting[0]
            blocks, hit, boundary = kv.get_computed_blocks(req)
            req.shared_prefix_boundary = boundary
            admits.append((req.request_id, hit))
            n = self._split(req, min(req.num_tokens - hit, budget), hit)
            if n <= 0:
                break
            if not kv.allocate_slots(req, n, hit, blocks):
                break
            self.waiting.popleft()
            self.admitted.add(req.request_id)
            req.num_computed_tokens = hit
            self.running.append(req)
            scheduled[req.request_id] = n
            budget -= n
        kv.release(kv.take_copies())
        for req in list(self.running):
            n = scheduled.get(req.request_id)
            if n is None:
                continue
            req.num_computed_tokens += n
            if req.num_computed_tokens < req.num_tokens:
                continue
            outs = self.outputs[req.request_id]
            k = self.num_output[req.request_id]
            req.append_tokens([outs[k]])
            self.num_output[req.request_id] = k + 1
            if k + 1 >= len(outs):
                self.running.remove(req)
                self._finish(req)
        return admits, kv.take_events()
