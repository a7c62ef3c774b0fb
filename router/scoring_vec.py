"""The hybrid hit rule for every worker of one group layout at once (numpy).

Why: a per-worker Python pass (slice a column, build acceptors, descend) costs ~10 us
per worker, so a score grew with workers x blocks. Here each group's membership is one
(workers x request blocks) matrix and the rule's common case is a few whole-matrix
operations in C; what is left per worker is building its result row.

The rule (``offload_core.hit_rule``) over aligned candidates ``p <= max_candidate``:
full attention accepts ``p`` up to its prefix (the first miss), so every answer is at
most ``cap`` = the shortest full-attention prefix. A sliding-window or mamba group's
own hit is then ``cap`` itself when it accepts ``cap`` -- one masked ``any`` per matrix
-- and otherwise the reference descent (``GroupAcceptor.floor``) on that worker's row;
the joint hit is the groups' common own hit, or ``longest_hit`` when they differ. So
every answer is the reference rule's, evaluated in bulk where it is trivially so
(tested against the per-worker path on random fleets). EAGLE workers keep the
per-worker path.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

from offload_core.hit_rule import GroupAcceptor, GroupSpec, longest_hit, max_candidate

Bools = NDArray[np.bool_]
Ints = NDArray[np.int64]


def tier_hits(
    specs: Sequence[GroupSpec], step: int, cached: Sequence[Bools], n: int
) -> tuple[Ints, list[Ints]]:
    """(joint hit, each group's own hit) per row, for one tier.

    ``cached[g]``: workers x (request blocks of group g), True where cached.
    """
    m = cached[0].shape[0]
    top = max_candidate(n, step)
    if top <= 0:
        zero = np.zeros(m, dtype=np.int64)
        return zero, [zero] * len(specs)
    own: list[Ints] = [np.zeros(0, dtype=np.int64)] * len(specs)
    cap = np.full(m, top, dtype=np.int64)
    others = []
    for i, (spec, z) in enumerate(zip(specs, cached, strict=True)):
        if spec.rule != "full":
            others.append(i)
            continue
        first_miss = np.where(z.all(axis=1), z.shape[1], z.argmin(axis=1))
        own[i] = np.minimum(first_miss * spec.block_size, top) // step * step
        cap = np.minimum(cap, own[i])
    if not others:
        return cap, own
    rows = np.arange(m)
    for i in others:
        spec, z = specs[i], cached[i]
        ends = cap // spec.block_size
        if spec.rule == "sliding":
            start = np.maximum(ends - spec.window_blocks, 0)
            blocks = np.arange(z.shape[1])
            window = (blocks >= start[:, None]) & (blocks < ends[:, None])
            ok = ~(window & ~z).any(axis=1)
        else:  # mamba: a state block ends exactly at the hit
            ok = z[rows, np.maximum(ends - 1, 0)]
        own[i] = np.where(ok | (ends == 0), cap, -1)
        for r in np.flatnonzero(own[i] < 0).tolist():  # the reference descent
            own[i][r] = GroupAcceptor(spec, z[r].tobytes()).floor(int(cap[r]), step)
    if len(others) == 1:
        return own[others[0]], own
    lo = np.minimum.reduce([own[i] for i in others])
    hi = np.maximum.reduce([own[i] for i in others])
    joint = lo.copy()
    for r in np.flatnonzero(lo != hi).tolist():
        lists = [z[r].tobytes() for z in cached]
        joint[r] = longest_hit(int(lo[r]) + 1, specs, lists)
    return joint, own
