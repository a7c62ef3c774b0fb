"""The hybrid hit rule for every worker at once, on presence bitsets (memory index).

Why: the index keeps, per (group, block key), one int with four bits per worker slot
(any medium, GPU, CPU, STORAGE; ``router.index.base.Bits``). ANDing
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
The GPU-only view is the same computation on the GPU bits (one above each any-medium
bit), for the slots holding some read block offloaded only; the others' GPU view is
their any-medium view. Tier-weighted
scores of workers whose hit needs offloaded blocks are computed per worker
(``Scorer._weighted`` on media bytes unpacked for those workers only). EAGLE workers,
gapped group indices and workers at another hash unit keep the per-worker path.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import reduce
from itertools import accumulate, chain, compress, islice, repeat, takewhile
from math import isfinite
from operator import and_, ne, or_

import numpy as np

from router import native
from router.index.base import GPU_BIT, Bits, BlockKey, GroupMeta
from router.score.protos import Classes, Proto, labels, make_proto, proto_spec
from router.score.rows import GroupRow, WorkerRow, sort_rows
from router.score.rule import Plan
from router.score.tiers import tier_counts, weigh_native
from schemas.hit_rule import max_candidate

ALL = -1  # every bit set: what an empty window (a hit ending at block 0) accepts


def prefix_classes(pa: list[int]) -> Classes:
    """``pa[i]``: slots whose prefix is ``>= i`` blocks (``pa[0]`` the cohort, no zero
    entries) -> {prefix blocks: slots with exactly that prefix}."""
    n = len(pa)
    out = {i: pa[i] ^ pa[i + 1] for i in compress(range(n - 1), map(ne, pa, islice(pa, 1, None)))}
    out[n - 1] = pa[-1]
    return out


def accepts(vals: list[int], rule: str, width: int) -> list[int]:
    """``out[e]``: the slots (bits of every field) whose sliding-window or mamba group
    accepts a hit ending at block ``e`` (``out[0]``: everyone), for ``e <= len(vals)``.

    A window's AND from per-chunk prefix and suffix ANDs (chunks of the window's
    length): ``AND[e - w, e) = suffix[e - w] & prefix[e - 1]``. Every step is a C-level
    ``accumulate`` / ``map``: O(blocks), no Python loop."""
    if rule == "mamba":
        return [ALL, *vals]
    if native.windows is not None:  # router/native: the same ANDs, operands reused
        return native.windows(vals, width)
    n, w = len(vals), width
    parts = [vals[s : s + w] for s in range(0, n, w)]
    pre = list(chain.from_iterable(accumulate(c, and_) for c in parts))
    if n < w:
        return [ALL, *pre]
    suf = list(chain.from_iterable(list(accumulate(reversed(c), and_))[::-1] for c in parts))
    return [ALL, *pre[: w - 1], *map(and_, suf[: n - w + 1], pre[w - 1 :])]


def sweep(classes: Classes, cand: list[int], step: int) -> Classes:
    """{largest candidate ``<= cap`` that ``cand`` accepts: slots} for {cap: slots};
    ``cand[c]``: the slots accepting candidate ``c * step``. The search for the next
    accepted candidate of the pending slots is one C-level ``compress`` per class."""
    order = sorted(((cap // step, bits) for cap, bits in classes.items()), reverse=True)
    if native.sweep is not None:  # router/native: the same loop, candidates tested in C
        return native.sweep(order, cand, step)
    out: Classes = {}
    pending = 0
    i, n = 0, len(order)
    last = len(cand) - 1
    while i < n:
        c, bits = order[i]
        pending |= bits
        i += 1
        low = order[i][0] if i < n else 0
        hi = min(c, last)
        while pending and hi > low:
            e = next(
                compress(
                    range(hi, low, -1),
                    map(and_, reversed(cand[low + 1 : hi + 1]), repeat(pending)),
                ),
                0,
            )
            if not e:
                break
            ok = cand[e] & pending
            out[e * step] = out.get(e * step, 0) | ok
            pending ^= ok
            hi = e - 1
    if pending:
        out[0] = out.get(0, 0) | pending
    return out


def _candidates(per_block: list[tuple[int, list[int]]], step: int) -> list[int]:
    """Candidate-indexed acceptance (``c * step``) from block-indexed lists, ANDed over
    the groups given as (block size, list)."""
    lists = [acc if step == bs else acc[:: step // bs] for bs, acc in per_block]
    if len(lists) == 1:
        return lists[0]
    n = min(map(len, lists))
    out = lists[0][:n]
    for other in lists[1:]:
        out = list(map(and_, out, other[:n]))
    return out


def _view(
    plan: Plan,
    vals: dict[int, list[int]],
    cands: dict[int, list[int]],
    joint_cand: list[int] | None,
    full_cls: dict[int, Classes],
    top: int,
    mask: int,
) -> tuple[Classes, list[Classes]]:
    """(joint hit classes, each group's own hit classes) for one tier view: slots'
    bits in the field ``mask`` selects (``mask``: the cohort's bits in that field)."""
    step = plan.step
    own: list[Classes] = [{} for _ in plan.shapes]
    cap: Classes = {top: mask}
    for g, (bs, rule, _) in enumerate(plan.shapes):
        if rule != "full":
            continue
        pc = full_cls.get(g)
        if pc is None:
            pc = prefix_classes(list(takewhile(bool, accumulate(vals[g], and_, initial=mask))))
        cls: Classes = {}
        for blocks, bits in pc.items():
            v = min(blocks * bs, top) // step * step
            cls[v] = cls.get(v, 0) | bits
        own[g] = cls
        if len(cap) == 1 and top in cap:
            cap = cls
            continue
        nxt: Classes = {}
        for c1, b1 in cap.items():
            for c2, b2 in cls.items():
                x = b1 & b2
                if x:
                    v = min(c1, c2)
                    nxt[v] = nxt.get(v, 0) | x
        cap = nxt
    if not cands:
        return cap, own
    for g, cand in cands.items():
        own[g] = sweep(cap, cand, step)
    if joint_cand is None:
        return own[next(iter(cands))], own
    return sweep(cap, joint_cand, step), own


def _merge(same: Classes, keep: int, gpu: Classes) -> Classes:
    """GPU-view classes: ``keep``'s slots as in the any-medium view, the others from
    ``gpu`` (computed on the GPU bits, one above each slot's any-medium bit)."""
    out: Classes = {}
    for k, b in same.items():
        x = b & keep
        if x:
            out[k] = x
    for k, b in gpu.items():
        out[k] = out.get(k, 0) | (b >> 1)
    return out


def cohort_rows(
    plan: Plan,
    metas: tuple[GroupMeta, ...],
    members: list[tuple[str, int]],
    bits: Bits,
    keys: Sequence[Sequence[BlockKey]],
    n: int,
    weight: list[float],
    ordered: bool = False,
    mask: int = 0,
) -> list[WorkerRow]:
    """Rows of one cohort (workers of one group layout); ``keys[g]``: group ``g``'s
    request block keys. ``ordered``: best first, as ``sort_rows`` orders them.
    ``mask``: the members' any-medium bits when known (``Bits.masks``)."""
    nslots = bits.slots
    step = plan.step
    top = max_candidate(n, step)
    cohort = mask  # the cohort's any-medium bits (bit 4s for slot s)
    if not cohort:
        for _, s in members:
            cohort |= 1 << (4 * s)
    tables = bits.tables
    vals: dict[int, list[int]] = {}
    ors: dict[int, int] = {}  # group -> the OR of vals[g], when the lookup gave it
    full_cls: dict[int, Classes] = {}  # group -> its prefix classes (``prefix_classes``)
    reach = top  # tokens any slot can hit: the longest full-attention prefix
    for g, (bs, rule, _) in enumerate(plan.shapes):
        if rule != "full":
            continue
        t = tables.get(g) or {}
        ks = keys[g]
        if isinstance(t, dict):
            get = t.get
            pa = list(takewhile(bool, accumulate(map(get, ks, repeat(0)), and_, initial=cohort)))
            depth = len(pa) - 1
            vals[g] = list(map(get, islice(ks, depth)))  # type: ignore[arg-type]  # dict.get
            full_cls[g] = prefix_classes(pa)
        else:  # router.native.U64Map: the classes, values and their OR from one C call
            full_cls[g], vals[g], ors[g] = t.prefix(ks, cohort)
            depth = len(vals[g])
        reach = min(reach, depth * bs)
    blocks: dict[int, tuple[int, list[int]]] = {}
    for g, (bs, rule, wb) in enumerate(plan.shapes):
        if rule == "full":
            continue
        t = tables.get(g) or {}
        if isinstance(t, dict):
            vals[g] = list(map(t.get, islice(keys[g], reach // bs), repeat(0)))
        else:  # router.native.U64Map: batched, prefetched lookups
            vals[g] = t.lookup(keys[g], reach // bs, 0)
        blocks[g] = (bs, accepts(vals[g], rule, wb))
    cands = {g: _candidates([b], step) for g, b in blocks.items()}
    joint = _candidates(list(blocks.values()), step) if len(blocks) > 1 else None
    hit, own = _view(plan, vals, cands, joint, full_cls, top, cohort)
    # Slots holding some read block on CPU or STORAGE: only their GPU view differs.
    off = 0
    for g, v in vals.items():
        if v:
            r = ors[g] if g in ors else reduce(or_, v)
            off |= (r >> 2) | (r >> 3)  # CPU or STORAGE bits moved onto any-medium bits
    off &= cohort
    if off:
        hit_g, own_g = _view(plan, vals, cands, joint, {}, top, off << 1)
        keep = cohort ^ off
        if native.rows is not None:  # merged by the C row loop: (same, keep, gpu)
            hit_g = (hit, keep, hit_g)  # type: ignore[assignment]
            own_g = [(a, keep, g) for a, g in zip(own, own_g, strict=True)]  # type: ignore[misc]
        else:
            hit_g = _merge(hit, keep, hit_g)
            own_g = [_merge(a, keep, g) for a, g in zip(own, own_g, strict=True)]
    else:
        hit_g, own_g = hit, own
    attrs = [hit, hit_g, *own, *own_g]
    uniq: list[Classes] = []  # views and groups often share one dict
    where: list[int] = []
    for attr in attrs:
        j = next((j for j, u in enumerate(uniq) if u is attr or u == attr), len(uniq))
        if j == len(uniq):
            uniq.append(attr)
        where.append(j)
    order = [4 * s for _, s in members]
    g_n = len(metas)
    wg = weight[GPU_BIT]
    shapes = plan.shapes

    w_h, w_hg = where[0], where[1]
    # per group: (index, kind, block size, where its own hit and GPU hit are in a key)
    fixed = [
        (g, m.kind, m.block_size, where[2 + g], where[2 + g_n + g]) for g, m in enumerate(metas)
    ]

    spec = proto_spec(GroupRow, w_h, w_hg, fixed, shapes, weight)
    memo: dict[tuple[int, ...], Proto] = {}

    def weigh(late: list[tuple[int, Proto]]) -> list[float]:
        """The scores of members (index, prototype) whose hits need offloaded blocks:
        the same float operations as ``Scorer._weighted``, for all of them at once."""
        hits = [p[0] for _, p in late]
        slots = [members[i][1] for i, _ in late]
        if native.tiers is not None:  # a few workers: lists beat numpy's calls
            return weigh_native(plan, vals, slots, late, weight)
        ng, nc, ns, cnt = tier_counts(plan, vals, nslots, slots, hits)
        total = ng * wg + nc * weight[2] + ns * weight[4]
        fl = (np.asarray(hits) * total / np.maximum(cnt, 1)).tolist()
        return [round(max(f, p[1] * wg), 3) for f, (_, p) in zip(fl, late, strict=True)]

    if native.rows is not None:  # router/native: labels, rows and their order in C
        # ``fetch_bits`` lists a cohort's members by id, so C's order by (score, hit),
        # ties in member order, is ``sort_rows``'s (for scores that are not NaN).
        wids = [wid for wid, _ in members]
        nbytes = (4 * nslots + 7) // 8
        in_c = ordered and all(map(isfinite, (wg, weight[2], weight[4])))
        out, _ = native.rows(WorkerRow, wids, order, uniq, nbytes, memo, spec, in_c, weigh)
        if ordered and not in_c:
            sort_rows(out)
        return out
    out = []
    late: list[tuple[int, Proto]] = []
    for i, (member, row) in enumerate(zip(members, labels(uniq, nslots, order), strict=True)):
        key = tuple(row)
        got = memo.get(key)
        if got is None:
            got = memo[key] = make_proto(spec, key)
        if got[2] is None:
            late.append((i, got))
        else:
            out.append(WorkerRow(member[0], got[0], got[1], got[2], True, list(got[3])))
    if late:
        for (i, (h, hg, _, rows)), score in zip(late, weigh(late), strict=True):
            out.append(WorkerRow(members[i][0], h, hg, score, True, list(rows)))
    if ordered:
        sort_rows(out)
    return out
