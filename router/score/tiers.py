"""Tier-weighted scores of the bitset path's workers whose hits need offloaded blocks
(``router.score.bits``): per worker, the blocks its hit needs counted by best tier, and
the score ``Scorer._weighted`` gives from those counts. Split from ``bits`` (its size);
the same float operations as the numpy columns path (``router.score.vec``), so every
path gives the identical float.
"""

from __future__ import annotations

import numpy as np

from router import native
from router.index.base import GPU_BIT
from router.score.protos import Proto
from router.score.rule import Plan


def tier_counts(
    plan: Plan, vals: dict[int, list[int]], nslots: int, slots: list[int], hits: list[int]
) -> tuple[np.ndarray, ...]:
    """Per slot, the blocks its hit needs (every group) by best tier: (GPU, CPU only,
    STORAGE only, all) -- what ``Scorer._weighted`` counts, for every offloaded slot at
    once: the groups' needed blocks in one matrix of only the bytes holding those slots'
    bits, counts by prefix sums. Every needed block is cached (the hit was accepted),
    so STORAGE only is the rest."""
    m = len(slots)
    p = np.asarray(hits, dtype=np.int64)
    idx = np.asarray(slots, dtype=np.int64)
    ranges = []
    parts: list[int] = []
    if native.tiers is not None:  # router/native: counted on the ints, no byte rows
        for bs, rule, wb in plan.shapes:
            end = p // bs
            ranges.append((_start(end, rule, wb), end))
        count = sum(e - b for b, e in ranges)
        ng, nc = native.tiers(
            [vals[g] for g in range(len(ranges))],
            [b.tolist() for b, _ in ranges],
            [e.tolist() for _, e in ranges],
            (4 * idx).tolist(),
        )
        n_gpu, n_cpu = np.asarray(ng, dtype=np.int64), np.asarray(nc, dtype=np.int64)
        return n_gpu, n_cpu, count - n_gpu - n_cpu, count
    for g, (bs, rule, wb) in enumerate(plan.shapes):
        end = p // bs
        start = _start(end, rule, wb)
        off = len(parts)
        parts += vals[g][: int(end.max())]
        ranges.append((start + off, end + off))
    count = sum(e - b for b, e in ranges)
    if not parts:
        zero = np.zeros(m, dtype=np.int64)
        return zero, zero, count, count
    width = (nslots + 1) // 2  # two slots per byte
    raw = native.pack(parts, width)
    rows = np.frombuffer(raw, dtype=np.uint8).reshape(len(parts), width)
    nib = 4 * (idx % 2)
    shift = np.concatenate([nib + 1, nib + 2]).astype(np.uint8)  # GPU, CPU bits
    gc = (rows[:, np.tile(idx // 2, 2)] >> shift) & 1
    gc[:, m:] &= 1 - gc[:, :m]  # CPU only
    cs = np.zeros((len(parts) + 1, 2 * m), dtype=np.int32)
    np.cumsum(gc, axis=0, out=cs[1:])
    cols = np.arange(2 * m)
    got = sum(cs[np.tile(e, 2), cols] - cs[np.tile(b, 2), cols] for b, e in ranges)
    n_gpu, n_cpu = got[:m].astype(np.int64), got[m:].astype(np.int64)
    return n_gpu, n_cpu, count - n_gpu - n_cpu, count


def weigh_native(
    plan: Plan,
    vals: dict[int, list[int]],
    slots: list[int],
    late: list[tuple[int, Proto]],
    weight: list[float],
) -> list[float]:
    """``weigh`` on the compiled core with lists: per slot the float operations of
    ``tier_counts`` and ``weigh``'s numpy lines, in the same order (int * float converts
    the int exactly, as numpy does), so both give the identical float."""
    hits = [p[0] for _, p in late]
    starts: list[list[int]] = []
    ends: list[list[int]] = []
    for bs, rule, wb in plan.shapes:
        end = [h // bs for h in hits]
        ends.append(end)
        if rule == "full":
            starts.append([0] * len(end))
        elif rule == "sliding":
            starts.append([e - wb if e > wb else 0 for e in end])
        else:
            starts.append([e - 1 if e > 1 else 0 for e in end])
    assert native.tiers is not None
    ng, nc = native.tiers([vals[g] for g in range(len(ends))], starts, ends, [4 * s for s in slots])
    cnt = [sum(t) for t in zip(*ends, strict=True)]
    for b in starts:
        cnt = [c - x for c, x in zip(cnt, b, strict=True)]
    wg, wc, ws = weight[GPU_BIT], weight[2], weight[4]
    out = []
    for h, (_, p), g, c, n in zip(hits, late, ng, nc, cnt, strict=True):
        total = g * wg + c * wc + (n - g - c) * ws
        out.append(round(max(h * total / (n if n > 1 else 1), p[1] * wg), 3))
    return out


def _start(end: np.ndarray, rule: str, wb: int) -> np.ndarray:
    """Where each slot's needed blocks of a group start (its hit's blocks end at ``end``):
    every block for full attention, the window for sliding, the last block for mamba."""
    if rule == "full":
        return np.zeros(len(end), dtype=np.int64)
    if rule == "sliding":
        return np.maximum(end - wb, 0)
    return np.maximum(end - 1, 0)
