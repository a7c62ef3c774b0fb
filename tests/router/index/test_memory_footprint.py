"""The memory index's bytes per (worker, block) entry: at most 100 and flat in the worker
count (issue 13). Two things made them grow with workers: a new presence int per key
even where a prefix's keys are held by the same workers (an int is as wide as the
highest worker slot holding it), and the ingestor's recent token ranges keeping every
key of a long store as an int object. Measured with tracemalloc: deterministic, not a
timing."""

from __future__ import annotations

import gc
import random
import tracemalloc

import pytest

from router.index.base import GPU_BIT, GroupMeta, RemoveOp, StoreOp
from router.index.memory import MemoryIndex
from router.ingest.ingestor import Ingestor
from schemas import BlockStored, KVEventBatch

GROUPS = {0: GroupMeta("full_attention", 16)}
BS = 16


def _distinct_values(index: MemoryIndex) -> int:
    return len({id(v) for t in index._tables.values() for _, v in t.items()})


async def test_a_prefix_held_by_the_same_workers_shares_its_presence_ints(core: str) -> None:
    """Three workers hold a 64-block chain to depths 64 / 40 / 20 on slots far apart:
    one int per distinct holder set (4 of them), not one per key; removals and a
    cleared worker keep sharing, and every key still answers its holders."""
    index = MemoryIndex()
    hashes, keys = list(range(1, 65)), list(range(1001, 1065))
    for i in range(40):  # slots up to 40: the ints are 160 bits wide
        await index.apply(f"pad{i}", GROUPS, [StoreOp(0, GPU_BIT, [9000 + i], [90000 + i])])
    for w, depth in (("a", 64), ("b", 40), ("c", 20)):
        await index.apply(w, GROUPS, [StoreOp(0, GPU_BIT, hashes[:depth], keys[:depth])])
    pads = 40  # one solo value per padding worker
    assert _distinct_values(index) == pads + 3  # {a,b,c} 0..19, {a,b} 20..39, {a} 40..63
    want = {w: [1] * d + [0] * (64 - d) for w, d in (("a", 64), ("b", 40), ("c", 20))}
    for w, rows in want.items():
        assert await index.copies(w, 0, keys) == rows
    await index.apply("a", GROUPS, [RemoveOp(0, GPU_BIT, hashes[10:])])
    assert _distinct_values(index) <= pads + 4
    want["a"] = [1] * 10 + [0] * 54
    for w, rows in want.items():
        assert await index.copies(w, 0, keys) == rows
    await index.clear_worker("c")
    assert _distinct_values(index) <= pads + 4
    assert await index.copies("c", 0, keys) == [0] * 64
    assert await index.copies("b", 0, keys) == [1] * 40 + [0] * 24


def _fleet(n_workers: int, entries: int, seed: int) -> list[tuple[str, KVEventBatch]]:
    """Each worker stores a shared system prompt, then prefixes of conversations four
    workers share on average (each store a whole conversation: long ranges)."""
    rng = random.Random(seed)
    blocks, sys_blocks = 128, 8
    system = [rng.randrange(150_000) for _ in range(sys_blocks * BS)]
    per_worker = max(1, round((entries / n_workers - sys_blocks) / (blocks / 2)))
    n_convs = max(4, per_worker * n_workers // 4)
    convs = [
        system + [rng.randrange(150_000) for _ in range((blocks - sys_blocks) * BS)]
        for _ in range(n_convs)
    ]
    out = []
    for w in range(n_workers):
        for j, c in enumerate(rng.sample(range(n_convs), min(n_convs, per_worker))):
            depth = rng.randint(sys_blocks + 1, blocks)
            start = sys_blocks if j else 0

            def ext(i: int, c: int = c) -> int:
                return i + 1 if i < sys_blocks else ((c + 1) << 20) | i

            ev = BlockStored(
                [ext(i) for i in range(start, depth)],
                ext(start - 1) if start else None,
                convs[c][start * BS : depth * BS],
                BS, None, "GPU", None,
                group_idx=0, kv_cache_spec_kind="full_attention",
            )  # fmt: skip
            out.append((f"w{w}", KVEventBatch(0.0, [ev])))
    return out


async def _bytes_per_entry(n_workers: int) -> float:
    batches = _fleet(n_workers, 64_000, seed=n_workers)
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        index = MemoryIndex()
        ing = Ingestor(index)  # kept alive: its recent ranges are the router's bytes too
        for wid, batch in batches:
            await ing.apply_batch(wid, batch)
        assert ing.counters.bad_events == 0 and ing.counters.unknown_parent == 0
        gc.collect()
        used = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    return used / int((await index.stats())["entries"])


async def test_bytes_per_entry_stay_well_under_100_and_flat_in_workers(core: str) -> None:
    """The same number of entries over 8 and over 64 workers (as the side-by-side
    benchmark compares them). Before: 76.9 and 105.9 bytes; now 50.3 and 58.0, the
    rest of the step being per-worker records (~7 KB a worker, ~950 entries each at 64
    workers here, ~15,000 in the benchmark). With shared ints but the recent ranges'
    keys as int objects it would be ~85 and ~93: hence 70, not the issue's 100."""
    if core == "python":
        pytest.skip("the bound is the compiled core's (the fallback keeps dicts of ints)")
    few, many = await _bytes_per_entry(8), await _bytes_per_entry(64)
    assert few <= 70 and many <= 70, (few, many)
    assert many <= few * 1.25, (few, many)
