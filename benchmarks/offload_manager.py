"""CPU offloading manager: eviction-policy hit ratios and manager operations per second.

* hit ratio of LRU vs ARC on (a) a scan-polluted workload (a hot set used twice, then a
  one-pass scan larger than the cache, repeated) and (b) a Zipf-like workload, each
  access going through the real ``CPUOffloadingManager`` protocol (lookup -> touch, or
  prepare_store -> complete_store);
* manager throughput: lookup+touch / store operations per second;
* the key representation decision of ``offload_core.base``: GC collections and dict
  membership time for bytes keys vs ``(hash, group)`` tuples.

Run: ``python benchmarks/offload_manager.py [--json]``.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from offload_core.base import OffloadKey, ReqContext, make_offload_key
from offload_core.cpu import CPUOffloadingManager

CTX = ReqContext()


def key(i: int) -> OffloadKey:
    return make_offload_key(i.to_bytes(32, "big"), 0)


def scan_workload(rounds: int = 200, hot: int = 4, scan: int = 12) -> list[int]:
    accesses: list[int] = []
    nxt = 10_000
    for _ in range(rounds):
        accesses += list(range(hot)) * 2
        accesses += list(range(nxt, nxt + scan))
        nxt += scan
    return accesses


def zipf_workload(n: int = 50_000, universe: int = 2_000, s: float = 1.1) -> list[int]:
    rng = random.Random(0)
    weights = [1.0 / (r + 1) ** s for r in range(universe)]
    return rng.choices(range(universe), weights=weights, k=n)


def hit_ratio(policy: str, accesses: list[int], capacity: int) -> tuple[float, float]:
    """(hit ratio, accesses per second) through the manager's full protocol."""
    m = CPUOffloadingManager(capacity, policy=policy, enable_events=False)
    keys = {i: key(i) for i in set(accesses)}
    hits = 0
    t0 = time.perf_counter()
    for i in accesses:
        k = keys[i]
        if m.lookup(k, CTX):
            m.touch([k], CTX)
            hits += 1
        else:
            out = m.prepare_store([k], CTX)
            if out is not None:
                m.complete_store(out.keys_to_store, CTX)
    elapsed = time.perf_counter() - t0
    return hits / len(accesses), len(accesses) / elapsed


def key_representation(n: int = 200_000) -> dict[str, Any]:
    hashes = [random.Random(1).getrandbits(256).to_bytes(32, "big") for _ in range(1)]
    digests = [(hashes[0][:28] + i.to_bytes(4, "big")) for i in range(n)]
    out: dict[str, Any] = {}
    for name, build in (
        ("tuple", lambda: [(d, 1) for d in digests]),
        ("bytes", lambda: [make_offload_key(d, 1) for d in digests]),
    ):
        gc.collect()
        before = gc.get_stats()[0]["collections"]
        keys = build()
        after = gc.get_stats()[0]["collections"]
        table = dict.fromkeys(keys)
        probes = build()  # fresh key objects, as a new request would build them
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            for k in probes:
                _ = k in table
            best = min(best, time.perf_counter() - t0)
        out[name] = {
            "gen0_collections": after - before,
            "lookup_ns": round(best / n * 1e9, 1),
        }
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    results: dict[str, Any] = {"hit_ratio": {}, "ops_per_s": {}}
    for name, accesses, cap in (
        ("scan", scan_workload(), 8),
        ("zipf", zipf_workload(), 200),
    ):
        for policy in ("lru", "arc"):
            ratio, ops = hit_ratio(policy, accesses, cap)
            results["hit_ratio"][f"{name}/{policy}"] = round(ratio, 3)
            results["ops_per_s"][f"{name}/{policy}"] = round(ops)
    results["keys"] = key_representation()
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    print("workload/policy   hit ratio   accesses/s")
    for k, v in results["hit_ratio"].items():
        print(f"{k:<16}  {v:>9.3f}   {results['ops_per_s'][k]:>10,}")
    for name, v in results["keys"].items():
        print(f"keys {name:<6} gen0 GCs {v['gen0_collections']:>4}  lookup {v['lookup_ns']} ns")
    return 0


if __name__ == "__main__":
    sys.exit(main())
