"""A class of slots' result in the bitset path (``router.score.bits``): its prototype
row and each slot's class labels.

Why a module: the prototype -- (hit, hit_gpu, score or None, group rows) -- is described
by a *spec* (plain data) so the compiled core builds it in C (``router/native/proto.c``,
~0.6 us of bytecode per class saved: on a "typical" fleet nearly every worker is a class
of its own); ``make_proto`` is the same function in Python, for the pure-Python core and
as the reference the tests compare C against.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from router import native
from router.index.base import CPU_BIT, GPU_BIT, STORAGE_BIT
from router.score.rows import GroupRow

Classes = dict[int, int]  # value (tokens) -> bitset of slots
# A class of slots' (hit, hit_gpu, score or None, group rows).
Proto = tuple[int, int, float | None, list[GroupRow]]
# (group row type, key position of the hit, of the GPU hit, per group (g, kind, block
# size, key position of its own hit, of its GPU hit), per group (block size, rule code,
# window blocks), (GPU, CPU, STORAGE weights), {hit: all-GPU score} filled as made)
Spec = tuple[
    type[GroupRow],
    int,
    int,
    tuple[tuple[int, str | None, int, int, int], ...],
    tuple[tuple[int, int, int], ...],
    tuple[float, float, float],
    dict[int, float],
]
RULE_CODE = {"full": 0, "sliding": 1, "mamba": 2}  # proto.c's codes


def proto_spec(
    row_type: type[GroupRow],
    w_h: int,
    w_hg: int,
    fixed: Sequence[tuple[int, str | None, int, int, int]],
    shapes: Sequence[tuple[int, str, int]],
    weight: Sequence[float],
) -> Spec:
    """The spec of one cohort's prototypes (``weight``: by media bitmask)."""
    return (
        row_type,
        w_h,
        w_hg,
        tuple(fixed),
        tuple((bs, RULE_CODE[rule], wb) for bs, rule, wb in shapes),
        (weight[GPU_BIT], weight[CPU_BIT], weight[STORAGE_BIT]),
        {},
    )


def make_proto(spec: Spec, key: tuple[int, ...]) -> Proto:
    """(hit, hit_gpu, score or None when offloaded blocks weigh in, group rows) of one
    class of slots (``key``: its labels); the score is ``Scorer._weighted``'s float for
    a hit held on GPUs throughout (the same operations in the same order)."""
    row_type, w_h, w_hg, fixed, shapes, (wg, wc, ws), scores = spec
    h, hg = key[w_h], key[w_hg]
    rows = [row_type(g, kind, bs, True, key[a], key[b]) for g, kind, bs, a, b in fixed]
    score: float | None = 0.0
    if h > 0 and hg < h:  # the hit needs offloaded blocks: weights per worker
        return h, hg, None, rows
    if h > 0:
        got = scores.get(h) if hg == h else None
        if got is None:
            count = 0
            for bs, rule, wb in shapes:
                end = h // bs
                count += end if rule == 0 else min(end, wb) if rule == 1 else 1
            total = count * wg + 0 * wc + 0 * ws
            got = round(max(h * total / count if count else float(h), hg * wg), 3)
            if hg == h:
                scores[h] = got
        score = got
    return h, hg, score, rows


def labels(attrs: list[Classes], nslots: int, order: list[int]) -> list[list[int]]:
    """Per slot (``order``: their any-medium bit positions), its value in each of
    ``attrs`` ({value: slots}): every bitset unpacked into one (bitsets x bits) 0/1
    matrix in C; within an attribute exactly one bitset holds a slot, so its row is an
    ``argmax``."""
    width = (nslots + 1) // 2
    bitsets = [b for a in attrs for b in a.values()]
    raw = native.pack(bitsets, width)
    bits = np.unpackbits(
        np.frombuffer(raw, dtype=np.uint8).reshape(len(bitsets), width), axis=1, bitorder="little"
    )[:, order]
    out = np.empty((len(order), len(attrs)), dtype=np.int64)
    r = 0
    for i, a in enumerate(attrs):
        values = np.fromiter(a, dtype=np.int64, count=len(a))
        out[:, i] = values[bits[r : r + len(a)].argmax(axis=0)] if len(a) > 1 else values[0]
        r += len(a)
    labels: list[list[int]] = out.tolist()
    return labels
