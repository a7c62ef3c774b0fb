"""kvroute's in-process index side by side with Dynamo's Rust indexer (issue 13).

Both run in this one process on the same pre-generated workload: multi-turn
conversations (a shared 1,024-token system prompt, then each conversation's own tokens;
a worker holds a random-depth prefix of a few conversations: each turn extends the
last), 8,192-token prompts, 16-token blocks, one full-attention group (Dynamo's radix
tree has no hybrid rule). Measured:

* ingest, block events/s: kvroute ``Ingestor.apply_batch`` (decoded ``BlockStored``
  events with token ids: kvroute keys blocks by its own chain from the tokens) vs
  Dynamo ``RadixTree.apply_event`` (serialized events carrying the per-block
  ``tokens_hash`` a Dynamo publisher computes). Events are built before the clock starts;
  Dynamo applies on a background thread, so its clock stops at a ``find_matches`` that
  returns after every queued event. Dynamo's clock covers parsing its JSON events, so
  kvroute is also timed from the published msgpack payloads (decoded as the subscriber
  decodes them, then applied): the "from msgpack bytes" figure.
* score p50/p99, hash + match: kvroute ``Scorer.score_result`` (chain hash, lookups, the
  hit rule, one row per worker) vs ``compute_block_hash_for_seq`` + ``find_matches``;
  queries alternate between the two, and every per-worker hit is compared (kvroute's
  ``hit_tokens`` = Dynamo's matched blocks x 16, capped at the request's last full block
  below ``n - 1`` tokens like vLLM).
* bytes per (worker, block) entry: the process's RSS growth while each index is built
  (kvroute also with tracemalloc).
* scaling: score p50 and ingest of a further 50k block events at 100k ... 4M entries.

Wall time (Dynamo's work runs on its own thread); ratios are kvroute / Dynamo, from one
run. Needs ``ai-dynamo-runtime`` (``make bench-dynamo`` builds ``.venv-dynamo``); skipped
with a message when it is not importable. ``--quick``: smaller sizes, under 2 minutes.
Run: ``python benchmarks/dynamo_side_by_side.py [--quick] [--json]``.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import itertools
import json
import os
import random
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.stats import pct_ms
from router import native
from router.index import make_index
from router.ingest import packed
from router.ingest.ingestor import Ingestor
from router.score.scorer import Scorer
from schemas import BlockStored, KVEventBatch
from schemas.decode import decode_batch

BS = 16
PROMPT = 8192
SYSTEM = 1024
BLOCKS = PROMPT // BS
SYS_BLOCKS = SYSTEM // BS
_EVENT_IDS = itertools.count(1)


def _dynamo() -> Any:
    try:
        from dynamo import _core
    except ImportError:
        return None
    return _core


class Workload:
    """Conversations, and which prefix of which conversations each worker holds."""

    def __init__(self, n_workers: int, entries: int, seed: int) -> None:
        rng = random.Random(seed)
        per_worker = max(1, entries // n_workers)
        self.convs_per_worker = max(1, round((per_worker - SYS_BLOCKS) / (BLOCKS / 2)))
        self.n_convs = max(16, self.convs_per_worker * n_workers // 4)
        self.system = [rng.randrange(150_000) for _ in range(SYSTEM)]
        self.pool = [rng.randrange(150_000) for _ in range(1 << 20)]
        self.offsets = [rng.randrange(len(self.pool) - PROMPT) for _ in range(self.n_convs)]
        self.rng = rng
        self.n_workers = n_workers
        self._local: dict[int, list[int]] = {}

    def prompt(self, c: int) -> list[int]:
        off = self.offsets[c]
        return self.system + self.pool[off : off + PROMPT - SYSTEM]

    def ext_hash(self, c: int, i: int) -> int:
        """The engine's (external) hash of block ``i`` of conversation ``c``: the shared
        system blocks hash alike in every conversation."""
        return i + 1 if i < SYS_BLOCKS else ((c + 1) << 20) | i

    def holdings(self) -> list[tuple[int, int]]:
        """(conversation, depth in blocks) per conversation a worker holds."""
        convs = self.rng.sample(range(self.n_convs), min(self.n_convs, self.convs_per_worker))
        return [(c, self.rng.randint(SYS_BLOCKS + 1, BLOCKS)) for c in convs]

    def events(
        self, hash_seq: Any, workers: range, local: bool = True
    ) -> tuple[list[tuple[str, KVEventBatch]], list[tuple[int, bytes]], int]:
        """kvroute batches, Dynamo serialized events and their block-event count."""
        kv: list[tuple[str, KVEventBatch]] = []
        dyn: list[tuple[int, bytes]] = []
        total = 0
        for w in workers:
            for j, (c, depth) in enumerate(self.holdings()):
                toks = self.prompt(c)
                lh = self._local.get(c)
                if lh is None and local:
                    lh = self._local[c] = hash_seq(toks, BS)
                # The first conversation stores the system prompt; later ones hit it
                # (vLLM's prefix cache) and store only their own blocks after it.
                start = SYS_BLOCKS if j else 0
                hashes = [self.ext_hash(c, i) for i in range(start, depth)]
                parent = self.ext_hash(c, start - 1) if start else None
                ev = BlockStored(
                    hashes, parent, toks[start * BS : depth * BS], BS, None, "GPU", None,
                    group_idx=0, kv_cache_spec_kind="full_attention",
                )  # fmt: skip
                kv.append((f"w{w}", KVEventBatch(0.0, [ev])))
                blocks = [
                    {"block_hash": h, "tokens_hash": lh[start + i]} if lh else {}
                    for i, h in enumerate(hashes)
                ]
                data = {"stored": {"parent_hash": parent, "blocks": blocks}}
                # Event ids grow per worker across calls (Dynamo keeps the last one seen).
                eid = next(_EVENT_IDS)
                dyn.append((w, json.dumps({"event_id": eid, "data": data}).encode()))
                total += len(hashes)
        return kv, dyn, total


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


async def _kv_ingest_wire(index: Any, wire: list[tuple[str, bytes]]) -> float:
    """Ingest from the published msgpack payloads, decoded as the subscriber decodes them
    (``router.ingest.packed.decode``, else ``decode_batch``): Dynamo's clock, too, covers
    parsing its serialized events."""
    ing = Ingestor(index)
    gc.collect()
    t0 = time.perf_counter()
    for wid, payload in wire:
        await ing.apply_batch(wid, packed.decode(payload) or decode_batch(payload))
    dt = time.perf_counter() - t0
    assert ing.counters.bad_events == 0 and ing.counters.unknown_parent == 0
    return dt


async def _kv_ingest(index: Any, kv: list[tuple[str, KVEventBatch]]) -> float:
    ing = Ingestor(index)
    gc.collect()
    t0 = time.perf_counter()
    for wid, batch in kv:
        await ing.apply_batch(wid, batch)
    dt = time.perf_counter() - t0
    assert ing.counters.bad_events == 0 and ing.counters.unknown_parent == 0
    return dt


def _dyn_ingest(core: Any, tree: Any, dyn: list[tuple[int, bytes]]) -> float:
    gc.collect()
    t0 = time.perf_counter()
    for w, raw in dyn:
        tree.apply_event(w, raw)
    tree.find_matches([1])  # returns after every queued event was applied
    return time.perf_counter() - t0


async def _scores(core: Any, wl: Workload, index: Any, tree: Any, queries: int) -> dict[str, Any]:
    scorer = Scorer(index)
    workers = [f"w{w}" for w in range(wl.n_workers)]
    rng = random.Random(5)
    await scorer.score_result(wl.prompt(0), workers)  # warm: learns the block size
    kv_t: list[float] = []
    dyn_t: list[float] = []
    agree = compared = hits = 0
    top = (PROMPT - 1) // BS * BS
    for _ in range(queries):
        toks = wl.prompt(rng.randrange(wl.n_convs))
        t0 = time.perf_counter()
        res = await scorer.score_result(toks, workers)
        t1 = time.perf_counter()
        got = tree.find_matches(core.compute_block_hash_for_seq(toks, BS)).scores
        t2 = time.perf_counter()
        kv_t.append(t1 - t0)
        dyn_t.append(t2 - t1)
        blocks = {f"w{w}": n for (w, _rank), n in got.items()}
        for row in res.workers:
            compared += 1
            hits += row.hit_tokens > 0
            agree += row.hit_tokens == min(blocks.get(row.worker_id, 0) * BS, top)
    kv50, kv99, dyn50, dyn99 = (pct_ms(t, q) for t in (kv_t, dyn_t) for q in (0.5, 0.99))
    return {
        "kv_p50_ms": kv50,
        "kv_p99_ms": kv99,
        "dyn_p50_ms": dyn50,
        "dyn_p99_ms": dyn99,
        "ratio_p50": round(kv50 / max(dyn50, 1e-6), 2),
        "ratio_p99": round(kv99 / max(dyn99, 1e-6), 2),
        "agree": f"{agree}/{compared}",
        "worker_hits": hits,
    }


async def fleet(core: Any, n_workers: int, entries: int, queries: int) -> dict[str, Any]:
    """Ingest, bytes and score at one fleet size."""
    wl = Workload(n_workers, entries, seed=n_workers)
    kv, dyn, total = wl.events(core.compute_block_hash_for_seq, range(n_workers))
    encode = msgspec.msgpack.Encoder().encode
    wire = [(wid, encode(batch)) for wid, batch in kv]
    gc.collect()
    base = _rss()
    tree = core.RadixTree()
    dyn_s = _dyn_ingest(core, tree, dyn)
    dyn_bytes = _rss() - base
    index = make_index("memory")
    gc.collect()
    base = _rss()
    kv_s = await _kv_ingest(index, kv)
    gc.collect()
    kv_bytes = _rss() - base
    entries_kv = int((await index.stats())["entries"])
    out = {
        "workers": n_workers,
        "entries": entries_kv,
        "block_events": total,
        "kv_ingest_per_s": round(total / kv_s),
        "dyn_ingest_per_s": round(total / dyn_s),
        "ingest_ratio": round(dyn_s / kv_s, 2),
        "kv_bytes_per_entry": round(kv_bytes / max(entries_kv, 1), 1),
        "dyn_bytes_per_entry": round(dyn_bytes / max(entries_kv, 1), 1),
    }
    # The pre-built events are the harness's, not the index's: freed before scoring so
    # neither side's score pays for the collector walking millions of event objects.
    del kv, dyn
    gc.collect()
    out.update(await _scores(core, wl, index, tree, queries))
    # From the wire: a fresh index, once the measured one is gone (its bytes were taken).
    del index
    gc.collect()
    kv_wire_s = await _kv_ingest_wire(make_index("memory"), wire)
    out["kv_wire_ingest_per_s"] = round(total / kv_wire_s)
    out["wire_ingest_ratio"] = round(dyn_s / kv_wire_s, 2)
    out["kv_core"] = native.ACTIVE
    return out


def traced_bytes(n_workers: int, entries: int) -> float:
    """kvroute bytes per entry by tracemalloc: what the index keeps (engine hashes too)
    and what the ingestor that fed it keeps (its recent token ranges' keys), both alive
    as in a router."""
    wl = Workload(n_workers, entries, seed=n_workers)
    kv, _, _ = wl.events(None, range(n_workers), local=False)
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    index = make_index("memory")
    ing = Ingestor(index)

    async def feed(batches: list[tuple[str, KVEventBatch]]) -> None:
        for wid, batch in batches:
            await ing.apply_batch(wid, batch)

    asyncio.run(feed(kv))
    del kv
    gc.collect()
    used = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    assert ing.counters.bad_events == 0
    return round(used / int(asyncio.run(index.stats())["entries"]), 1)


async def scaling(core: Any, sizes: list[int], n_workers: int, queries: int) -> list[Any]:
    """Score p50 and ingest of 50k more block events as the index grows."""
    out = []
    for entries in sizes:
        wl = Workload(n_workers, entries, seed=entries)
        index = make_index("memory")
        tree = core.RadixTree()
        step = max(1, n_workers // 8)
        for lo in range(0, n_workers, step):  # built in slices: bounded event memory
            kv, dyn, _ = wl.events(core.compute_block_hash_for_seq, range(lo, lo + step))
            await _kv_ingest(index, kv)
            _dyn_ingest(core, tree, dyn)
        more = Workload(n_workers, 50_000, seed=entries + 1)
        # The same conversations (tokens and engine hashes), other holdings.
        more.system, more.offsets, more.pool, more.n_convs = (
            wl.system,
            wl.offsets,
            wl.pool,
            wl.n_convs,
        )
        kv, dyn, total = more.events(core.compute_block_hash_for_seq, range(n_workers))
        kv_s = await _kv_ingest(index, kv)
        dyn_s = _dyn_ingest(core, tree, dyn)
        row = {
            "entries": int((await index.stats())["entries"]),
            "kv_ingest_per_s": round(total / kv_s),
            "dyn_ingest_per_s": round(total / dyn_s),
        }
        del kv, dyn
        gc.collect()
        row.update(await _scores(core, wl, index, tree, queries))
        out.append(row)
        del index, tree
        gc.collect()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workers", default="8,64,256")
    ap.add_argument("--entries", type=int, default=1_000_000, help="(worker, block) entries")
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--scale", default="100000,1000000,4000000")
    ap.add_argument("--scale-workers", type=int, default=64)
    ap.add_argument("--quick", action="store_true", help="smaller sizes: under 2 minutes")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    core = _dynamo()
    if core is None:
        print(
            "ai-dynamo-runtime is not importable: side-by-side skipped "
            "(make bench-dynamo builds .venv-dynamo with it)"
        )
        return 0
    if args.quick:
        args.entries, args.queries, args.scale = 200_000, 60, "100000,400000"
    sizes = [int(x) for x in args.workers.split(",") if x]
    res: dict[str, Any] = {"load_avg": os.getloadavg()[0], "fleets": [], "scaling": []}
    for n in sizes:
        res["fleets"].append(asyncio.run(fleet(core, n, args.entries, args.queries)))
    res["kv_traced_bytes_per_entry"] = {n: traced_bytes(n, args.entries) for n in sizes}
    scale = [int(x) for x in args.scale.split(",") if x]
    res["scaling"] = asyncio.run(scaling(core, scale, args.scale_workers, args.queries // 2))
    res["load_avg_end"] = os.getloadavg()[0]
    if args.json:
        print(json.dumps(res, indent=2))
        return 0
    print(f"load average {res['load_avg']:.2f} -> {res['load_avg_end']:.2f}")
    for r in res["fleets"]:
        print(
            f"{r['workers']:>4} workers {r['entries']:>9,} entries | ingest kvroute "
            f"{r['kv_ingest_per_s']:>9,}/s Dynamo {r['dyn_ingest_per_s']:>9,}/s "
            f"(kvroute/Dynamo {r['ingest_ratio']}x; from msgpack bytes "
            f"{r['kv_wire_ingest_per_s']:,}/s, {r['wire_ingest_ratio']}x) | "
            f"score p50 {r['kv_p50_ms']} vs "
            f"{r['dyn_p50_ms']} ms ({r['ratio_p50']}x), p99 {r['kv_p99_ms']} vs "
            f"{r['dyn_p99_ms']} ms ({r['ratio_p99']}x) | bytes/entry (RSS) "
            f"{r['kv_bytes_per_entry']} vs {r['dyn_bytes_per_entry']} | agree {r['agree']}"
        )
    for n, b in res["kv_traced_bytes_per_entry"].items():
        print(f"kvroute bytes/entry (tracemalloc) at {n} workers: {b}")
    for r in res["scaling"]:
        print(
            f"scale {r['entries']:>9,} entries | score p50 {r['kv_p50_ms']} vs "
            f"{r['dyn_p50_ms']} ms ({r['ratio_p50']}x) | ingest {r['kv_ingest_per_s']:,} vs "
            f"{r['dyn_ingest_per_s']:,}/s | agree {r['agree']}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
