"""The data path: per-group KV tensors and a worker that moves blocks between tiers.

Each group owns a device tensor ``[num_gpu_blocks, 2, block_size, num_heads, head_dim]``
(K and V) and a CPU tensor of the same shape with ``num_cpu_blocks`` rows (pinned when the
device is CUDA, so copies can be asynchronous). Block ids index the first dimension in
both tiers: the GPU pool's ids on the device, the CPU manager's ``CPULoadStoreSpec`` ids
on the host.

A transfer moves a *set* of blocks per group, its pairs sorted by CPU id. Where the CPU ids
form long runs (the manager hands out free slots in order, so they usually do) each run is
one copy straight between the device and the CPU pool: on CUDA one DMA per run into or out
of pinned memory, with no host-side work at all. Otherwise the blocks go through one gather
(``index_select``) and one scatter (``index_copy_``) per group, via pinned staging on CUDA.
Host-side gathers and scatters move rows of 8-byte words, not KV elements: torch's CPU
indexing copies such rows with memcpy, 2-8x faster than bfloat16 elements
(``benchmarks/engine.py``). On CUDA the device side runs on a dedicated stream and the
host side is finished when its event has fired; ``poll``/``wait`` then report completion
to the offloading manager (``complete_store`` / ``complete_load``), exactly once per job.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from offload_core.base import OffloadingManager, OffloadKey, ReqContext, get_offload_group_idx
from offload_core.cpu.common import CPULoadStoreSpec
from schemas.hashing import external_hash
from schemas.hit_rule import GroupSpec

_MOD = 65521  # prime < 2**16: pattern values are exact in float32

# Runs of consecutive CPU ids averaging at least this many bytes are copied run by run; a
# copy costs a few microseconds to issue (Python + cudaMemcpyAsync), about what a host
# memcpy of this many bytes costs, so shorter runs go through one gather + scatter instead.
DIRECT_RUN_BYTES = 256 * 1024


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _rows(t: torch.Tensor) -> torch.Tensor:
    """``t`` (contiguous) as one row of 8-byte words (or bytes) per block."""
    flat = t.view(t.shape[0], -1).view(torch.uint8)
    return flat.view(torch.int64) if flat.shape[1] % 8 == 0 else flat


def runs_of(ids: Sequence[int]) -> list[tuple[int, int, int]]:
    """``(position, first id, length)`` of each maximal run of consecutive ``ids``."""
    out: list[tuple[int, int, int]] = []
    start = 0
    for i in range(1, len(ids) + 1):
        if i == len(ids) or ids[i] != ids[i - 1] + 1:
            out.append((start, ids[start], i - start))
            start = i
    return out


class KVBuffers:
    """The KV tensors of every group on the device and in (pinned) host memory."""

    def __init__(
        self,
        groups: Sequence[GroupSpec],
        num_gpu_blocks: int,
        num_cpu_blocks: int,
        num_heads: int = 2,
        head_dim: int = 8,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ) -> None:
        self.groups = list(groups)
        self.device = torch.device(device) if device is not None else default_device()
        self.dtype = dtype
        self.pinned = self.device.type == "cuda"
        self.gpu = [
            torch.zeros((num_gpu_blocks, 2, g.block_size, num_heads, head_dim), dtype=dtype,
                        device=self.device)
            for g in self.groups
        ]  # fmt: skip
        self.cpu = [
            torch.zeros((num_cpu_blocks, 2, g.block_size, num_heads, head_dim), dtype=dtype,
                        pin_memory=self.pinned)
            for g in self.groups
        ]  # fmt: skip
        self._offsets: list[torch.Tensor | None] = [None] * len(self.groups)

    def block_bytes(self, group: int) -> int:
        t = self.gpu[group]
        return t[0].numel() * t.element_size()

    # ---------------------------------------------------- deterministic contents
    def pattern(self, group: int, digests: Sequence[bytes]) -> torch.Tensor:
        """The KV values of blocks ``digests`` of ``group`` (a function of group, hash and
        position in the block), shaped like ``gpu[group][ids]``, on the device."""
        offsets = self._offsets[group]
        if offsets is None:
            shape = self.gpu[group].shape[1:]
            n = int(torch.Size(shape).numel())
            offsets = (torch.arange(n, dtype=torch.int64, device=self.device) * 40503) % _MOD
            offsets = offsets.view(shape)
            self._offsets[group] = offsets
        seeds = torch.tensor(
            [(external_hash(d) ^ (group * 0x9E3779B97F4A7C15)) % _MOD for d in digests],
            dtype=torch.int64,
            device=self.device,
        )
        values = (seeds.view(-1, *([1] * offsets.dim())) + offsets) % _MOD
        return values.to(self.dtype)

    def write(self, group: int, block_ids: Sequence[int], digests: Sequence[bytes]) -> None:
        """Fill device blocks with their deterministic values (what "compute" produces)."""
        if not block_ids:
            return
        idx = torch.tensor(list(block_ids), dtype=torch.int64, device=self.device)
        self.gpu[group].index_copy_(0, idx, self.pattern(group, digests))

    def matches(self, group: int, block_ids: Sequence[int], digests: Sequence[bytes]) -> bool:
        """True when the device blocks hold exactly the values of ``digests``."""
        if not block_ids:
            return True
        idx = torch.tensor(list(block_ids), dtype=torch.int64, device=self.device)
        return bool(torch.equal(self.gpu[group].index_select(0, idx), self.pattern(group, digests)))


@dataclass(slots=True)
class _Job:
    job_id: int
    kind: str  # "store" | "load"
    keys: list[OffloadKey]
    ctx: ReqContext
    nbytes: int
    started: float
    event: Any = None  # torch.cuda.Event when asynchronous
    # Host-side scatters still to run once the event fired: (cpu tensor, cpu ids, staging).
    host_scatter: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = field(
        default_factory=list
    )
    keep_alive: list[torch.Tensor] = field(default_factory=list)


@dataclass(slots=True)
class _Pairs:
    """One group's share of a transfer, sorted by CPU id."""

    gidx: torch.Tensor  # device block ids (on the device)
    cidx: torch.Tensor  # CPU block ids, ascending (on the host)
    runs: list[tuple[int, int, int]]  # runs_of(CPU ids)
    direct: bool  # copied run by run (no gather/scatter on the host)


@dataclass(slots=True)
class TransferStats:
    direct_groups: int = 0  # group copies done run by run
    store_jobs: int = 0
    load_jobs: int = 0
    store_bytes: int = 0
    load_bytes: int = 0
    store_seconds: float = 0.0
    load_seconds: float = 0.0


class TransferWorker:
    """Copies block sets device->host (store) and host->device (load)."""

    def __init__(self, buffers: KVBuffers, manager: OffloadingManager) -> None:
        self.buffers = buffers
        self.manager = manager
        self.stats = TransferStats()
        self._next_id = 0
        self._jobs: dict[int, _Job] = {}
        self._cuda = buffers.device.type == "cuda"
        self._stream = torch.cuda.Stream(device=buffers.device) if self._cuda else None
        self.direct_run_bytes = DIRECT_RUN_BYTES
        self._scratch_bufs: dict[int, torch.Tensor] = {}

    @property
    def in_flight(self) -> int:
        return len(self._jobs)

    # ---------------------------------------------------------------- submit
    def store(
        self,
        keys: Sequence[OffloadKey],
        gpu_block_ids: Sequence[int],
        spec: CPULoadStoreSpec,
        ctx: ReqContext,
    ) -> int:
        """Copy device blocks to the CPU ids of ``spec`` (from ``prepare_store``)."""
        return self._submit("store", keys, gpu_block_ids, spec, ctx, self._store_group)

    def load(
        self,
        keys: Sequence[OffloadKey],
        spec: CPULoadStoreSpec,
        gpu_block_ids: Sequence[int],
        ctx: ReqContext,
    ) -> int:
        """Copy the CPU ids of ``spec`` (from ``prepare_load``) into device blocks."""
        return self._submit("load", keys, gpu_block_ids, spec, ctx, self._load_group)

    def _submit(
        self,
        kind: str,
        keys: Sequence[OffloadKey],
        gpu_block_ids: Sequence[int],
        spec: CPULoadStoreSpec,
        ctx: ReqContext,
        copy_group: Callable[[_Job, int, _Pairs], None],
    ) -> int:
        """One job: per group, the (GPU id, CPU id) pairs sorted by CPU id, one ``copy_group``."""
        job = self._new_job(kind, keys, ctx)
        buf = self.buffers
        for g, gpu_ids, cpu_ids in self._by_group(keys, gpu_block_ids, spec.block_ids):
            nbytes = len(gpu_ids) * buf.block_bytes(g)
            job.nbytes += nbytes
            order = sorted(range(len(cpu_ids)), key=cpu_ids.__getitem__)
            cids = [cpu_ids[i] for i in order]
            runs = runs_of(cids)
            direct = len(runs) == 1 or nbytes >= self.direct_run_bytes * len(runs)
            self.stats.direct_groups += direct
            gidx = torch.tensor([gpu_ids[i] for i in order], dtype=torch.int64, device=buf.device)
            copy_group(job, g, _Pairs(gidx, torch.tensor(cids, dtype=torch.int64), runs, direct))
        self._finish_submit(job)
        return job.job_id

    def _scratch(self, g: int, n: int) -> torch.Tensor:
        """A reusable host buffer of ``n`` blocks of group ``g`` (fresh memory is page-faulted
        in on first touch, which costs more than the copy itself)."""
        cur = self._scratch_bufs.get(g)
        if cur is None or cur.shape[0] < n:
            cur = torch.empty((n, *self.buffers.cpu[g].shape[1:]), dtype=self.buffers.dtype)
            self._scratch_bufs[g] = cur
        return cur[:n]

    def _store_group(self, job: _Job, g: int, p: _Pairs) -> None:
        """Device -> host: gather on the copy stream, then one copy per CPU run (or into
        pinned staging that the host scatters once the event fired)."""
        buf = self.buffers
        cpu, dev = buf.cpu[g], buf.gpu[g]
        if self._stream is None:
            if p.direct:
                for pos, first, n in p.runs:
                    torch.index_select(_rows(dev), 0, p.gidx[pos : pos + n],
                                       out=_rows(cpu[first : first + n]))  # fmt: skip
            else:
                staged = self._scratch(g, len(p.cidx))
                torch.index_select(_rows(dev), 0, p.gidx, out=_rows(staged))
                _rows(cpu).index_copy_(0, p.cidx, _rows(staged))
            return
        self._stream.wait_stream(torch.cuda.current_stream(buf.device))
        with torch.cuda.stream(self._stream):
            gathered = dev.index_select(0, p.gidx)
            if p.direct:
                for pos, first, n in p.runs:
                    cpu[first : first + n].copy_(gathered[pos : pos + n], non_blocking=True)
            else:
                staging = torch.empty(gathered.shape, dtype=buf.dtype, pin_memory=True)
                staging.copy_(gathered, non_blocking=True)
                job.host_scatter.append((cpu, p.cidx, staging))
        job.keep_alive += [gathered, p.gidx]

    def _load_group(self, job: _Job, g: int, p: _Pairs) -> None:
        """Host -> device: one copy per CPU run (or a host gather into pinned staging and one
        copy), then the scatter into the device blocks, on the copy stream."""
        buf = self.buffers
        cpu, dev = buf.cpu[g], buf.gpu[g]
        if self._stream is None:
            if p.direct:
                for pos, first, n in p.runs:
                    _rows(dev).index_copy_(0, p.gidx[pos : pos + n], _rows(cpu[first : first + n]))
            else:
                staged = self._scratch(g, len(p.cidx))
                torch.index_select(_rows(cpu), 0, p.cidx, out=_rows(staged))
                _rows(dev).index_copy_(0, p.gidx, _rows(staged))
            return
        shape = (len(p.cidx), *cpu.shape[1:])
        staging = None
        if not p.direct:
            staging = torch.empty(shape, dtype=buf.dtype, pin_memory=True)
            torch.index_select(_rows(cpu), 0, p.cidx, out=_rows(staging))
        self._stream.wait_stream(torch.cuda.current_stream(buf.device))
        with torch.cuda.stream(self._stream):
            if staging is None:
                on_device = torch.empty(shape, dtype=buf.dtype, device=buf.device)
                for pos, first, n in p.runs:
                    on_device[pos : pos + n].copy_(cpu[first : first + n], non_blocking=True)
            else:
                on_device = staging.to(buf.device, non_blocking=True)
                job.keep_alive.append(staging)
            dev.index_copy_(0, p.gidx, on_device)
        job.keep_alive += [on_device, p.gidx]

    # -------------------------------------------------------------- complete
    def poll(self) -> list[int]:
        """Complete every finished job (reporting to the manager); returns their ids."""
        done = [j for j in self._jobs.values() if j.event is None or j.event.query()]
        for job in done:
            self._complete(job)
        return [j.job_id for j in done]

    def wait(self, job_id: int | None = None) -> None:
        """Block until one job (or every job) is complete and reported."""
        jobs = list(self._jobs.values()) if job_id is None else [self._jobs[job_id]]
        for job in jobs:
            if job.event is not None:
                job.event.synchronize()
            self._complete(job)

    # ---------------------------------------------------------------- helpers
    def _new_job(self, kind: str, keys: Sequence[OffloadKey], ctx: ReqContext) -> _Job:
        self._next_id += 1
        return _Job(self._next_id, kind, list(keys), ctx, 0, time.perf_counter())

    def _finish_submit(self, job: _Job) -> None:
        if self._stream is not None:
            job.event = torch.cuda.Event()
            job.event.record(self._stream)
            # Later device work (reusing a stored slot, reading a loaded block) is ordered
            # after this copy without blocking the host.
            torch.cuda.current_stream(self.buffers.device).wait_event(job.event)
        self._jobs[job.job_id] = job

    def _complete(self, job: _Job) -> None:
        for cpu, cidx, staging in job.host_scatter:
            _rows(cpu).index_copy_(0, cidx, _rows(staging))
        del self._jobs[job.job_id]
        elapsed = time.perf_counter() - job.started
        s = self.stats
        if job.kind == "store":
            s.store_jobs += 1
            s.store_bytes += job.nbytes
            s.store_seconds += elapsed
            self.manager.complete_store(job.keys, job.ctx, success=True)
        else:
            s.load_jobs += 1
            s.load_bytes += job.nbytes
            s.load_seconds += elapsed
            self.manager.complete_load(job.keys, job.ctx)

    @staticmethod
    def _by_group(
        keys: Sequence[OffloadKey], gpu_ids: Sequence[int], cpu_ids: Sequence[int]
    ) -> list[tuple[int, list[int], list[int]]]:
        if not len(keys) == len(gpu_ids) == len(cpu_ids):
            raise ValueError("keys, GPU block ids and CPU block ids must align")
        groups: dict[int, tuple[list[int], list[int]]] = {}
        for key, gid, cid in zip(keys, gpu_ids, cpu_ids, strict=True):
            gg, cc = groups.setdefault(get_offload_group_idx(key), ([], []))
            gg.append(gid)
            cc.append(cid)
        return [(g, gg, cc) for g, (gg, cc) in sorted(groups.items())]
