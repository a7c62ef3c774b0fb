"""The torch data path: KV bytes survive a device->CPU->device round trip exactly."""

from __future__ import annotations

import pytest
import torch

from offload_core.base import ReqContext, make_offload_key
from offload_core.cpu import CPUOffloadingManager
from offload_core.groups import parse_groups
from offload_core.transfer import KVBuffers, TransferWorker, default_device, runs_of
from schemas.hashing import block_hashes

CTX = ReqContext()


def _setup(
    groups: str = "full:4,swa:8:16", gpu: int = 16, cpu: int = 8, dtype: torch.dtype = torch.float32
) -> tuple[KVBuffers, CPUOffloadingManager, TransferWorker]:
    specs = parse_groups(groups)
    buffers = KVBuffers(specs, gpu, cpu, num_heads=2, head_dim=4, dtype=dtype)
    manager = CPUOffloadingManager(cpu, "lru")
    return buffers, manager, TransferWorker(buffers, manager)


def test_buffers_have_the_documented_shape_and_device() -> None:
    buffers, _, _ = _setup()
    assert buffers.device == default_device()
    assert buffers.gpu[0].shape == (16, 2, 4, 2, 4)
    assert buffers.gpu[1].shape == (16, 2, 8, 2, 4)
    assert buffers.cpu[1].shape == (8, 2, 8, 2, 4)
    assert buffers.cpu[0].is_pinned() == (buffers.device.type == "cuda")
    assert buffers.block_bytes(0) == 2 * 4 * 2 * 4 * 4


def test_pattern_depends_on_group_hash_and_position() -> None:
    buffers, _, _ = _setup("full:4,full:4")
    d = block_hashes(list(range(8)), 4)
    a, b = buffers.pattern(0, d), buffers.pattern(1, d)
    assert not torch.equal(a[0], a[1])  # different hash
    assert not torch.equal(a[0], b[0])  # same hash, other group
    assert a[0].unique().numel() > a[0].numel() // 2  # positions differ within a block
    assert torch.equal(a, buffers.pattern(0, d))  # deterministic


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_store_then_load_round_trips_the_bytes_exactly(dtype: torch.dtype) -> None:
    buffers, manager, worker = _setup(dtype=dtype)
    tokens = list(range(40))
    d4, d8 = block_hashes(tokens, 4), block_hashes(tokens, 8)
    keys = [make_offload_key(d4[i], 0) for i in (1, 3, 4)] + [make_offload_key(d8[2], 1)]
    gpu_ids = [5, 0, 9, 7]
    buffers.write(0, gpu_ids[:3], [d4[1], d4[3], d4[4]])
    buffers.write(1, gpu_ids[3:], [d8[2]])
    before = [t.clone() for t in buffers.gpu]

    out = manager.prepare_store(keys, CTX)
    assert out is not None and out.keys_to_store == keys
    worker.store(keys, gpu_ids, out.store_spec, CTX)
    worker.wait()
    assert all(manager.is_ready(k) for k in keys)
    assert worker.in_flight == 0 and worker.stats.store_bytes == (
        3 * buffers.block_bytes(0) + buffers.block_bytes(1)
    )
    # Host copies hold exactly the device bytes.
    for g, cpu_id, gpu_id in zip([0, 0, 0, 1], out.store_spec.block_ids, gpu_ids, strict=True):
        assert torch.equal(buffers.cpu[g][cpu_id].view(torch.uint8).cpu(),
                           before[g][gpu_id].view(torch.uint8).cpu())  # fmt: skip

    for t in buffers.gpu:  # the slots get reused by something else
        t.fill_(-1)
    spec = manager.prepare_load(keys, CTX)
    new_ids = [2, 3, 4, 11]
    worker.load(keys, spec, new_ids, CTX)
    worker.wait()
    assert manager.ref_count(keys[0]) == 0  # complete_load reported
    assert buffers.matches(0, new_ids[:3], [d4[1], d4[3], d4[4]])
    assert buffers.matches(1, new_ids[3:], [d8[2]])
    for g, old, new in zip([0, 0, 0, 1], gpu_ids, new_ids, strict=True):
        assert torch.equal(buffers.gpu[g][new].view(torch.uint8), before[g][old].view(torch.uint8))
    assert not buffers.matches(0, [5], [d4[1]])  # the overwritten slot really changed


def test_completion_is_reported_once_through_poll() -> None:
    buffers, manager, worker = _setup()
    d = block_hashes(list(range(8)), 4)
    keys = [make_offload_key(x, 0) for x in d]
    buffers.write(0, [0, 1], d)
    out = manager.prepare_store(keys, CTX)
    assert out is not None
    job = worker.store(keys, [0, 1], out.store_spec, CTX)
    assert not manager.is_ready(keys[0])  # not visible before completion is reported
    done: list[int] = []
    while worker.in_flight:
        done += worker.poll()
    assert done == [job]
    assert manager.is_ready(keys[0]) and manager.is_ready(keys[1])
    assert worker.poll() == []
    assert [e.keys for e in manager.take_events()] == [keys]


def test_misaligned_ids_are_rejected() -> None:
    _, manager, worker = _setup()
    d = block_hashes(list(range(8)), 4)
    keys = [make_offload_key(x, 0) for x in d]
    out = manager.prepare_store(keys, CTX)
    assert out is not None
    with pytest.raises(ValueError):
        worker.store(keys, [0], out.store_spec, CTX)


def test_runs_of_splits_at_every_gap() -> None:
    assert runs_of([]) == []
    assert runs_of([4]) == [(0, 4, 1)]
    assert runs_of([0, 1, 2, 5, 6, 9]) == [(0, 0, 3), (3, 5, 2), (5, 9, 1)]


def _store_all(
    worker: TransferWorker, manager: CPUOffloadingManager, keys: list, gpu_ids: list[int]
) -> list[int]:
    out = manager.prepare_store(keys, CTX)
    assert out is not None and out.keys_to_store == keys
    worker.store(keys, gpu_ids, out.store_spec, CTX)
    worker.wait()
    return list(out.store_spec.block_ids)


@pytest.mark.parametrize("direct_run_bytes", [0, 1 << 40], ids=["run_by_run", "gather_scatter"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fragmented_and_reversed_cpu_ids_round_trip(
    direct_run_bytes: int, dtype: torch.dtype
) -> None:
    """CPU ids the manager hands out after evictions are neither ascending nor one run:
    both copy paths (a copy per run, or one gather + scatter) put every block's bytes in
    its own slot and back."""
    buffers, manager, worker = _setup("full:4", gpu=16, cpu=8, dtype=dtype)
    worker.direct_run_bytes = direct_run_bytes
    d = block_hashes(list(range(64)), 4)
    first = [make_offload_key(x, 0) for x in d[:8]]
    buffers.write(0, list(range(8)), d[:8])
    _store_all(worker, manager, first, list(range(8)))
    manager.touch(first[1::2], CTX)  # the even ones become least recently used
    fresh = [make_offload_key(x, 0) for x in d[8:12]]
    gpu_ids = [15, 9, 12, 10]
    buffers.write(0, gpu_ids, d[8:12])
    cpu_ids = _store_all(worker, manager, fresh, gpu_ids)
    assert sorted(cpu_ids) == [0, 2, 4, 6] and cpu_ids != sorted(cpu_ids)
    direct_before = worker.stats.direct_groups
    for t in buffers.gpu:
        t.fill_(-1)
    keys = fresh + first[1:4:2]  # fragmented ids, then a run in reverse order
    spec = manager.prepare_load(keys, CTX)
    new_ids = [3, 0, 14, 7, 2, 5]
    worker.load(keys, spec, new_ids, CTX)
    worker.wait()
    assert buffers.matches(0, new_ids, [*d[8:12], d[1], d[3]])
    assert worker.stats.direct_groups - direct_before == (1 if direct_run_bytes == 0 else 0)
    # The slots the manager freed really were overwritten (the evicted blocks are gone).
    assert not torch.equal(buffers.cpu[0][0].cpu(), buffers.pattern(0, [d[0]])[0].cpu())
