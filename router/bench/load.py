"""Offered load: how fast to replay a workload so the fleet is busy a given fraction.

``--load L`` rescales arrival times so that the work the requests bring, at a reference
hit rate, divided by the fleet's capacity over the replay's span is ``L``. The reference
is one LRU cache of every worker's blocks (the shared-cache bound, computed here on block
keys without engine hashing), so ``L`` is the load the *best possible* routing would see:
a policy that reuses less runs hotter than ``L``. Work per request is what the engine
model charges: the simple model prefill only, the charged model prefill (with attention
over the cached context) plus each output token's share of decode.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Iterable, Sequence

from router.bench.charged import ChargedModel


def block_keys(token_ids: Sequence[int], block: int) -> list[int]:
    """Chained keys of the full ``block``-token blocks of a prompt (router-local hash)."""
    out: list[int] = []
    parent = 0
    for start in range(0, len(token_ids) - block + 1, block):
        parent = hash((parent, tuple(token_ids[start : start + block])))
        out.append(parent)
    return out


def shared_lru_hits(
    prompts: Iterable[tuple[int, Sequence[int]]], capacity: int, block: int
) -> list[int]:
    """Hit tokens of each ``(prompt tokens, block keys)`` in one LRU of ``capacity`` blocks
    (a hit is the longest cached prefix of keys, capped below the prompt length)."""
    lru: OrderedDict[int, None] = OrderedDict()
    hits: list[int] = []
    for n, keys in prompts:
        h = 0
        for k in keys:
            if k not in lru:
                break
            h += 1
        hits.append(min(h * block, max(n - 1, 0)))
        for k in keys:
            lru[k] = None
            lru.move_to_end(k)
        while len(lru) > capacity:
            lru.popitem(last=False)
    return hits


def work_seconds(
    n: int, hit: int, out: int, model: ChargedModel | None, prefill_tps: float
) -> float:
    """Engine-seconds a request costs at speed 1.0 under the engine model."""
    miss = n - hit
    if model is None:
        return miss / prefill_tps
    prefill = miss * model.prefill_token_s + miss * (hit + miss / 2) * model.attn_s
    decode = out * (model.seq_s + model.kv_read_s * (n + out / 2))
    return prefill + decode


def time_scale_for(
    load: float,
    arrivals: Sequence[float],
    work: Sequence[float],
    capacity: float,
) -> float:
    """The arrival speed-up that makes ``sum(work) / (capacity * span) == load``."""
    if not 0 < load < math.inf:
        raise ValueError("load must be a positive finite number")
    span = max(arrivals) - min(arrivals) if arrivals else 0.0
    total = sum(work)
    # Requests that all arrive at once (or bring no work) cannot be spread to any load:
    # replaying them unscaled under a "load L" label reported figures of another load.
    if span <= 0:
        raise ValueError("--load needs requests that arrive at different times, not all at once")
    if total <= 0:
        raise ValueError("--load needs requests that bring work (all are free)")
    return load * capacity * span / total
