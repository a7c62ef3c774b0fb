"""The hybrid hit rule for every worker of one group layout at once (numpy).

Why: a per-worker Python pass (slice a column, build acceptors, descend) costs ~10 us
per worker, so a score grew with workers x blocks. Here each group's membership is one
(request blocks x workers) matrix and the rule's common case is a few whole-matrix
operations in C; what is left per worker is building its result row.

The rule (``schemas.hit_rule``) over aligned candidates ``p <= max_candidate``:
full attention accepts ``p`` up to its prefix (the first miss), so every answer is at
most ``cap`` = the shortest full-attention prefix. A sliding-window or mamba group's
own hit is then ``cap`` itself when it accepts ``cap`` -- one masked ``any`` per matrix
-- and otherwise the largest accepted candidate below it (a window holds no miss: equal
miss counts at its ends; computed for the rejected columns only); the joint hit is the
groups' common own hit, or ``longest_hit`` when they differ. Tested against the
per-worker path on random fleets. EAGLE workers keep the per-worker path.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
from numpy.typing import NDArray

from router.index.base import CPU_BIT, GPU_BIT, STORAGE_BIT, Columns, GroupMeta
from router.score.rows import GroupRow, WorkerRow, bulk_metas
from router.score.rule import Plan
from schemas.hit_rule import GroupAcceptor, GroupSpec, longest_hit, max_candidate

Bools = NDArray[np.bool_]
Ints = NDArray[np.int64]
# Up to this many columns, per-column Python beats a dozen numpy calls (~2 us each).
FEW = 8


def _largest(acc: Bools, step: int) -> Ints:
    """Per column, the tokens of the last true candidate row (0 when none)."""
    k = acc.shape[0]
    idx = k - 1 - acc[::-1].argmax(axis=0)
    found = acc[idx, np.arange(acc.shape[1])]
    return np.where(found, (idx + 1) * step, 0)


def _below(spec: GroupSpec, z: Bools, cap: Ints, step: int) -> Ints:
    """A sliding-window or mamba group's largest accepted candidate ``<= cap`` per column
    (candidates x columns; only for the few columns whose ``cap`` was rejected)."""
    k = int(cap.max()) // step
    if k <= 0:
        return np.zeros(z.shape[1], dtype=np.int64)
    cand = np.arange(1, k + 1, dtype=np.int64) * step
    ends = cand // spec.block_size
    if spec.rule == "sliding":
        misses = np.zeros((z.shape[0] + 1, z.shape[1]), dtype=np.int32)
        np.cumsum(~z, axis=0, out=misses[1:])
        acc = misses[ends] == misses[np.maximum(ends - spec.window_blocks, 0)]
    else:
        acc = z[ends - 1]
    return _largest(acc & (cand[:, None] <= cap[None, :]), step)


def tier_hits(
    specs: Sequence[GroupSpec], step: int, cached: Sequence[Bools], n: int
) -> tuple[Ints, list[Ints]]:
    """(joint hit, each group's own hit) per column, for one tier.

    ``cached[g]``: (request blocks of group g) x workers, True where cached. Blocks x
    workers, as the index stores them: every operation here is elementwise or reduces
    over the outer axis, the fast directions for numpy (no transposes).
    """
    m = cached[0].shape[1]
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
        first_miss = np.where(z.all(axis=0), z.shape[0], (~z).argmax(axis=0))
        own[i] = np.minimum(first_miss * spec.block_size, top) // step * step
        cap = np.minimum(cap, own[i])
    if not others:
        return cap, own
    cols = np.arange(m)
    for i in others:
        spec, z = specs[i], cached[i]
        ends = cap // spec.block_size
        if spec.rule == "sliding":
            start = np.maximum(ends - spec.window_blocks, 0).astype(np.int32)
            blocks = np.arange(z.shape[0], dtype=np.int32)[:, None]
            window = (blocks >= start) & (blocks < ends.astype(np.int32))
            ok = ~np.logical_and(window, ~z).any(axis=0)
        else:  # mamba: a state block ends exactly at the hit
            ok = z[np.maximum(ends - 1, 0), cols]
        own[i] = np.where(ok | (ends == 0), cap, -1)
        bad = np.flatnonzero(own[i] < 0)
        if bad.size > FEW:  # the group rejects ``cap``: scan every candidate below it
            own[i][bad] = _below(spec, z[:, bad], cap[bad], step)
        else:  # a few columns: the reference descent costs less than numpy's calls
            for c in bad.tolist():
                own[i][c] = GroupAcceptor(spec, z[:, c].tobytes()).floor(int(cap[c]), step)
    if len(others) == 1:
        return own[others[0]], own
    lo = np.minimum.reduce([own[i] for i in others])
    hi = np.maximum.reduce([own[i] for i in others])
    joint = lo.copy()
    for c in np.flatnonzero(lo != hi).tolist():
        lists = [z[:, c].tobytes() for z in cached]
        joint[c] = longest_hit(int(lo[c]) + 1, specs, lists)
    return joint, own


def tier_counts(
    specs: Sequence[GroupSpec], masks: Sequence[NDArray[np.uint8]], hits: Ints
) -> tuple[Ints, Ints, Ints, Ints]:
    """Per column, the blocks a hit needs (every group) by best tier: (GPU, CPU only,
    STORAGE only, all); what the tier-weighted score is made of (``Scorer._weighted``)."""
    m = hits.shape[0]
    gpu, cpu, sto, total = (np.zeros(m, dtype=np.int64) for _ in range(4))
    for spec, mat in zip(specs, masks, strict=True):
        end = hits // spec.block_size
        if spec.rule == "full":
            start = np.zeros_like(end)
        elif spec.rule == "sliding":
            start = np.maximum(end - spec.window_blocks, 0)
        else:
            start = np.maximum(end - 1, 0)
        blocks = np.arange(mat.shape[0], dtype=np.int64)[:, None]
        needed = (blocks >= start) & (blocks < end)
        on_gpu = (mat & 1).view(np.bool_)
        on_cpu = ((mat & 2) != 0) & ~on_gpu
        on_sto = ((mat & 4) != 0) & ~on_gpu & ~on_cpu
        gpu += (needed & on_gpu).sum(axis=0)
        cpu += (needed & on_cpu).sum(axis=0)
        sto += (needed & on_sto).sum(axis=0)
        total += end - start
    return gpu, cpu, sto, total


def columns_rows(
    cols: Columns,
    used: dict[int, int],
    n: int,
    weight: list[float],
    plan_for: Callable[[tuple[GroupMeta, ...]], Plan],
    weighted: Callable[[int, Plan, Sequence[bytes]], float],
) -> tuple[list[WorkerRow], list[str]]:
    """Rows computed per cohort (workers with identical metadata) over all its
    workers at once (``router.score.vec``), and the workers that need
    ``Scorer._via_snapshots`` instead (the columns path, ``Scorer(bits=False)``)."""
    out: list[WorkerRow] = [WorkerRow(w, 0, 0, 0.0, False) for w in cols.unknown]
    rest: list[str] = []
    exact = weight[GPU_BIT] == 1.0
    for snap, cohort in cols.cohorts:
        groups = snap.groups
        if not groups:
            out += [WorkerRow(w, 0, 0, 0.0, False) for w in cohort]
            continue
        metas = bulk_metas(snap, used, lambda g, m: (g, m.block_size) in cols.matrices)
        if metas is None:
            rest += cohort
            continue
        plan = plan_for(metas)
        idx = [cols.slots[w] for w in cohort]
        # blocks x workers, one matrix per group
        whole = idx == list(range(len(idx))) and len(idx) == cols.width
        masks = [
            mat if whole else mat[:, idx]
            for mat in (cols.matrices[(g, m.block_size)] for g, m in enumerate(metas))
        ]
        cached = [mat != 0 for mat in masks]
        on_gpu = [(mat & GPU_BIT).view(np.bool_) for mat in masks]
        hit, own = tier_hits(plan.specs, plan.step, cached, n)
        # Workers holding some block on no GPU: their GPU-only view differs.
        other = np.zeros(len(idx), dtype=np.bool_)
        for c, gpu, mat in zip(cached, on_gpu, masks, strict=True):
            if mat.max(initial=0) > GPU_BIT:  # some block is offloaded at all
                other |= (c > gpu).any(axis=0)
        hit_gpu, own_gpu = hit, own
        some = np.flatnonzero(other)
        if some.size:
            hit_gpu, own_gpu = hit.copy(), [o.copy() for o in own]
            sub_hit, sub_own = tier_hits(plan.specs, plan.step, [gpu[:, some] for gpu in on_gpu], n)
            hit_gpu[some] = sub_hit
            for o, so in zip(own_gpu, sub_own, strict=True):
                o[some] = so
        per = np.stack([*own, *own_gpu], axis=1).tolist()
        # Tier-weighted scores: p for hits held on GPUs throughout (weight 1.0),
        # else from the needed blocks' counts per tier, as ``_weighted`` does.
        scores = hit.astype(np.float64)
        mixed = np.arange(len(idx)) if not exact else some
        if 0 < mixed.size <= FEW:  # per worker: fewer calls than the bulk counts
            for j in mixed.tolist():
                lists = [mat[:, j].tobytes() for mat in masks]
                h = int(hit[j])
                scores[j] = max(weighted(h, plan, lists), hit_gpu[j] * weight[GPU_BIT])
        elif mixed.size:
            wg, wc, ws = (weight[GPU_BIT], weight[CPU_BIT], weight[STORAGE_BIT])
            ng, nc, ns, cnt = tier_counts(plan.specs, [m[:, mixed] for m in masks], hit[mixed])
            p = hit[mixed]
            total = ng * wg + nc * wc + ns * ws
            means = np.where(p > 0, p * total / np.maximum(cnt, 1), 0.0)
            scores[mixed] = np.maximum(means, hit_gpu[mixed] * wg)
        score_list = scores.tolist()
        for j in mixed.tolist():  # integral scores need no rounding
            score_list[j] = round(score_list[j], 3)
        group_rows: dict[tuple[int, ...], list[GroupRow]] = {}
        g_n = len(metas)
        append = out.append
        for wid, h, hg, og, score in zip(
            cohort, hit.tolist(), hit_gpu.tolist(), per, score_list, strict=True
        ):
            key = tuple(og)
            rows = group_rows.get(key)
            if rows is None:
                rows = group_rows[key] = [
                    GroupRow(g, m.kind, m.block_size, True, og[g], og[g_n + g])
                    for g, m in enumerate(metas)
                ]
            append(WorkerRow(wid, h, hg, score, True, list(rows)))
    return out, rest
