"""The hybrid hit rule for every worker at once, on presence bitsets (memory index).

Why: the index keeps, per (group, block key), one int with a bit per worker slot in
each of four fields (any medium, GPU, CPU, STORAGE; ``router.index.base.Bits``). ANDing
the request's ints along the prompt (``itertools.accumulate``, in C, stopping at the
first block no worker holds) gives every worker's full-attention prefix at once; workers
then fall into a few *classes* (equal prefixes), and the rest of the rule runs once per
class on bitsets, not once per worker. A score costs one lookup and one AND per prompt
block, plus a few operations per distinct pattern -- flat in the worker count up to the
cost of building one result row per worker.

The rule (``schemas.hit_rule``): ``cap`` = the shortest full-attention prefix (aligned to
the hit step, at most ``max_candidate``); a sliding-window or mamba group accepts a
candidate ``p`` when its window (last block) ending at ``p`` is cached, and its own hit
is the largest accepted candidate ``<= cap``; the joint hit is the largest candidate
every group accepts. Candidates are scanned downwards per class, and a window's AND is
answered in O(1) from per-chunk prefix/suffix ANDs (chunks of the window's length).
The GPU-only view is the same computation on field 1; when no key the request reads has
a CPU or STORAGE bit, it equals the any-medium view and is not computed. Tier-weighted
scores of workers whose hit needs offloaded blocks are computed per worker
(``Scorer._weighted`` on media bytes unpacked for those workers only). EAGLE workers,
gapped group indices and workers at another hash unit keep the per-worker path.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import accumulate, chain, compress, islice, repeat, takewhile
from operator import and_, ne

import numpy as np

from router.index.base import GPU_BIT, Bits, BlockKey, GroupMeta
from router.score.rows import GroupRow, WorkerRow
from router.score.rule import Plan
from schemas.hit_rule import max_candidate

ALL = -1  # every bit set: what an empty window (a hit ending at block 0) accepts
Classes = dict[int, int]  # value (tokens) -> bitset of slots


def prefix_classes(pa: list[int]) -> Classes:
    """``pa[i]``: slots whose prefix is ``>= i`` blocks (``pa[0]`` the cohort, no zero
    entries) -> {prefix blocks: slots with exactly that prefix}."""
    n = len(pa)
    out = {i: pa[i] ^ pa[i + 1] for i in compress(range(n - 1), map(ne, pa, islice(pa, 1, None)))}
    out[n - 1] = pa[-1]
    return out


class Window:
    """Which slots accept a hit ending at block ``e`` for one sliding/mamba group."""

    __slots__ = ("_pre", "_suf", "mamba", "vals", "width")

    def __init__(self, vals: list[int], rule: str, window_blocks: int) -> None:
        self.vals = vals
        self.mamba = rule == "mamba"
        self.width = window_blocks
        self._pre: list[int] | None = None
        self._suf: list[int] = []

    def _chunks(self) -> list[int]:
        w, vals = self.width, self.vals
        parts = [vals[s : s + w] for s in range(0, len(vals), w)]
        self._suf = list(
            chain.from_iterable(list(accumulate(reversed(c), and_))[::-1] for c in parts)
        )
        self._pre = pre = list(chain.from_iterable(accumulate(c, and_) for c in parts))
        return pre

    def at(self, e: int) -> int:
        if e <= 0:
            return ALL
        if e > len(self.vals):
            return 0
        if self.mamba:
            return self.vals[e - 1]
        pre = self._pre if self._pre is not None else self._chunks()
        w = self.width
        a = e - w
        if a <= 0:
            return pre[e - 1]  # chunk 0 from its start
        if a % w == 0:
            return self._suf[a]  # exactly one chunk
        return self._suf[a] & pre[e - 1]


def sweep(classes: Classes, checks: Sequence[tuple[int, Window]], step: int) -> Classes:
    """{largest candidate ``<= cap`` every check accepts: slots}, for {cap: slots}."""
    if not checks:
        return dict(classes)
    out: Classes = {}
    order = sorted(classes.items(), reverse=True)
    pending = 0
    i, n = 0, len(order)
    p = order[0][0]
    while True:
        while i < n and order[i][0] >= p:
            pending |= order[i][1]
            i += 1
        if p <= 0:
            if pending:
                out[0] = out.get(0, 0) | pending
            return out
        ok = pending
        for bs, win in checks:
            ok &= win.at(p // bs)
            if not ok:
                break
        if ok:
            out[p] = out.get(p, 0) | ok
            pending ^= ok
        if not pending:
            if i == n:
                return out
            p = order[i][0]
            continue
        p -= step


def _patterns(cohort: int, attrs: list[Classes]) -> list[tuple[tuple[int, ...], int]]:
    """The slots' distinct value tuples (one value per attribute) as (tuple, slots)."""
    cur: list[tuple[tuple[int, ...], int]] = [((), cohort)]
    for attr in attrs:
        items = list(attr.items())
        nxt = []
        for key, bits in cur:
            for val, b in items:
                x = bits & b
                if x:
                    nxt.append(((*key, val), x))
                    bits ^= x
                    if not bits:
                        break
        cur = nxt
    return cur


def _slots(bits: int) -> list[int]:
    out = []
    while bits:
        low = bits & -bits
        out.append(low.bit_length() - 1)
        bits ^= low
    return out


def _view(
    plan: Plan,
    metas: tuple[GroupMeta, ...],
    vals: dict[int, list[int]],
    windows: dict[int, Window],
    full_pa: dict[int, list[int]],
    top: int,
    mask: int,
) -> tuple[Classes, list[Classes]]:
    """(joint hit classes, each group's own hit classes) for one tier view: slots'
    bits in the field ``mask`` selects (``mask``: the cohort's bits in that field)."""
    step = plan.step
    own: list[Classes] = [{} for _ in metas]
    cap: Classes = {top: mask}
    for g, m in enumerate(metas):
        if m.rule != "full":
            continue
        pa = full_pa.get(g)
        if pa is None:
            pa = list(takewhile(bool, accumulate(vals[g], and_, initial=mask)))
        cls: Classes = {}
        for blocks, bits in prefix_classes(pa).items():
            v = min(blocks * m.block_size, top) // step * step
            cls[v] = cls.get(v, 0) | bits
        own[g] = cls
        nxt: Classes = {}
        for c1, b1 in cap.items():
            for c2, b2 in cls.items():
                x = b1 & b2
                if x:
                    v = min(c1, c2)
                    nxt[v] = nxt.get(v, 0) | x
        cap = nxt
    others = [g for g, m in enumerate(metas) if m.rule != "full"]
    for g in others:
        own[g] = sweep(cap, [(metas[g].block_size, windows[g])], step)
    if not others:
        return cap, own
    if len(others) == 1:
        return own[others[0]], own
    return sweep(cap, [(metas[g].block_size, windows[g]) for g in others], step), own


def _media(vals: list[int], stride: int, slots: list[int]) -> np.ndarray:
    """(blocks x len(slots)) media bitmasks of the given slots (1 GPU, 2 CPU, 4 STORAGE)."""
    if not vals:
        return np.zeros((0, len(slots)), dtype=np.uint8)
    raw = b"".join(map(int.to_bytes, vals, repeat(stride // 2), repeat("little")))
    rows = np.frombuffer(raw, dtype=np.uint8).reshape(len(vals), stride // 2)
    bits = np.unpackbits(rows, axis=1, bitorder="little")
    idx = np.asarray(slots)
    s = stride
    return bits[:, s + idx] | (bits[:, 2 * s + idx] << 1) | (bits[:, 3 * s + idx] << 2)


def cohort_rows(
    plan: Plan,
    metas: tuple[GroupMeta, ...],
    members: list[tuple[str, int]],
    bits: Bits,
    keys: Sequence[Sequence[BlockKey]],
    n: int,
    weight: list[float],
    weighted: Callable[[int, Plan, Sequence[bytes]], float],
) -> list[WorkerRow]:
    """Rows of one cohort (workers of one group layout); ``keys[g]``: group ``g``'s
    request block keys."""
    stride = bits.stride
    step = plan.step
    top = max_candidate(n, step)
    by_slot = {s: wid for wid, s in members}
    cohort = 0
    for s in by_slot:
        cohort |= 1 << s
    tables = bits.tables
    vals: dict[int, list[int]] = {}
    full_pa: dict[int, list[int]] = {}
    reach = top  # tokens any slot can hit: the longest full-attention prefix
    for g, m in enumerate(metas):
        if m.rule != "full":
            continue
        get = (tables.get(g) or {}).get
        ks = keys[g]
        pa = list(takewhile(bool, accumulate(map(get, ks, repeat(0)), and_, initial=cohort)))
        full_pa[g] = pa
        depth = len(pa) - 1
        vals[g] = list(map(get, islice(ks, depth)))
        reach = min(reach, depth * m.block_size)
    windows: dict[int, Window] = {}
    for g, m in enumerate(metas):
        if m.rule == "full":
            continue
        get = (tables.get(g) or {}).get
        vals[g] = list(map(get, islice(keys[g], reach // m.block_size), repeat(0)))
        spec = plan.specs[g]
        windows[g] = Window(vals[g], spec.rule, spec.window_blocks)
    hit, own = _view(plan, metas, vals, windows, full_pa, top, cohort)
    offloaded = any(v and max(v) >> (2 * stride) for v in vals.values())
    if offloaded:
        gm = cohort << stride
        hit_g, own_g = _view(plan, metas, vals, windows, {}, top, gm)
        hit_g = {k: b >> stride for k, b in hit_g.items()}
        own_g = [{k: b >> stride for k, b in c.items()} for c in own_g]
    else:
        hit_g, own_g = hit, own
    attrs = [hit, hit_g, *own, *own_g]
    # Distinct dicts only (views and groups often share one).
    uniq: list[Classes] = []
    where: list[int] = []
    for a in attrs:
        for j, u in enumerate(uniq):
            if u is a:
                where.append(j)
                break
        else:
            where.append(len(uniq))
            uniq.append(a)
    g_n = len(metas)
    wg = weight[GPU_BIT]
    out: list[WorkerRow] = []
    append = out.append
    shapes = plan.shapes
    for key, slots_bits in _patterns(cohort, uniq):
        vs = [key[j] for j in where]
        h, hg = vs[0], vs[1]
        og, ogg = vs[2 : 2 + g_n], vs[2 + g_n :]
        rows = [GroupRow(g, m.kind, m.block_size, True, og[g], ogg[g]) for g, m in enumerate(metas)]
        slots = _slots(slots_bits)
        if h > 0 and hg < h:  # the hit needs offloaded blocks: weights per worker
            mats = [_media(vals[g], stride, slots) for g in range(g_n)]
            for j, s in enumerate(slots):
                lists = [mat[:, j].tobytes() for mat in mats]
                score = round(max(weighted(h, plan, lists), hg * wg), 3)
                append(WorkerRow(by_slot[s], h, hg, score, True, list(rows)))
            continue
        if h > 0:  # every needed block on GPU: Scorer._weighted's float, once
            count = 0
            for bs, rule, wb in shapes:
                end = h // bs
                count += end if rule == "full" else min(end, wb) if rule == "sliding" else 1
            total = count * wg + 0 * weight[2] + 0 * weight[4]
            score = round(max(h * total / count if count else float(h), hg * wg), 3)
        else:
            score = 0.0
        for s in slots:
            append(WorkerRow(by_slot[s], h, hg, score, True, list(rows)))
    return out
