"""The compiled core's scorer loops (rows, GPU merge, windows, class prototypes, tiers,
window sweep) against the Python they replace in router.score."""

from __future__ import annotations

import random

import msgspec
import pytest

from router import native
from router.score.protos import labels as _labels
from router.score.protos import make_proto, proto_spec
from router.score.rows import GroupRow, WorkerRow, sort_rows

pytestmark = pytest.mark.skipif(not native.available(), reason="compiled core not built")
core = native._core


def _attrs(rng: random.Random, slots: list[int], n: int) -> list[dict[int, int]]:
    """``n`` attributes: each maps a value (0, 16, 32 or 48) to the bitset of the member
    slots (4 bits apart) that have it."""
    attrs = []
    for _ in range(n):
        classes: dict[int, int] = {}
        for s in slots:
            v = rng.choice([0, 16, 32, 48])
            classes[v] = classes.get(v, 0) | 1 << (4 * s)
        attrs.append(classes)
    return attrs


def test_rows_equal_the_python_loop() -> None:
    """Members' classes from the attrs' bitsets (what ``_labels`` computes with numpy),
    a prototype per class, rows best first with ties in member order (members come
    sorted by id), the unscored members apart: equal to the Python loop and
    ``sort_rows``, on random class layouts up to 150 slots."""
    rng = random.Random(4)
    for trial in range(150):
        nslots = rng.randrange(1, 150)
        slots = rng.sample(range(nslots), k=rng.randrange(1, nslots + 1))
        wids = sorted(f"w{s:03d}" for s in slots)
        by_id = dict(zip(sorted(f"w{s:03d}" for s in slots), sorted(slots), strict=True))
        order = [4 * by_id[w] for w in wids]
        attrs = _attrs(rng, slots, rng.randrange(2, 5))

        def make(key: tuple[int, ...]) -> tuple[int, int, float | None, list[GroupRow]]:
            h, hg = key[0], key[1]
            score = None if h == 48 and hg == 0 else float(max(h, hg))
            return h, hg, score, [GroupRow(0, "full_attention", 16, True, h, hg)]

        memo: dict[tuple[int, ...], object] = {}
        ordered = trial % 2 == 0
        got, mixed = core.rows(
            WorkerRow, wids, order, attrs, (4 * nslots + 7) // 8, memo, make, ordered
        )
        want, want_mixed = [], []
        for i, (w, lab) in enumerate(zip(wids, _labels(attrs, nslots, order), strict=True)):
            h, hg, score, rows = make(tuple(lab))
            if score is None:
                want_mixed.append((i, make(tuple(lab))))
            else:
                want.append(WorkerRow(w, h, hg, score, True, list(rows)))
        if ordered:
            sort_rows(want)
        assert msgspec.json.encode(got) == msgspec.json.encode(want)
        assert [(i, p[:3]) for i, p in mixed] == [(i, p[:3]) for i, p in want_mixed]
        assert len({id(r.groups) for r in got}) == len(got)  # no row shares a list
        assert len(memo) <= len(slots)


def test_rows_with_late_scores_equal_sort_rows() -> None:
    """Given ``late``, the unscored members' scores come from it (one call, members in
    order) and every row comes back in one list, best first as ``sort_rows`` orders
    them (members sorted by id), on random class layouts and scores with ties."""
    rng = random.Random(5)
    for trial in range(150):
        nslots = rng.randrange(1, 120)
        slots = list(range(nslots))
        wids = [f"w{s:03d}" for s in slots]
        order = [4 * s for s in slots]
        attrs = _attrs(rng, slots, 3)

        def make(key: tuple[int, ...]) -> tuple[int, int, float | None, list[GroupRow]]:
            h, hg = key[0], key[1]
            score = None if hg < h else float(h)
            return h, hg, score, [GroupRow(0, "full_attention", 16, True, h, hg)]

        calls: list[list[int]] = []

        def late(pairs: list[tuple[int, object]], calls: list[list[int]] = calls) -> list[float]:
            calls.append([i for i, _ in pairs])
            return [rng.choice([0.0, 8.0, 16.0, 40.0]) for _ in pairs]

        ordered = trial % 3 != 0
        nbytes = (4 * nslots + 7) // 8
        got, mixed = core.rows(WorkerRow, wids, order, attrs, nbytes, {}, make, ordered, late)
        assert mixed == []
        labs = _labels(attrs, nslots, order)
        late_idx = [i for i, lab in enumerate(labs) if lab[1] < lab[0]]
        assert calls == ([late_idx] if late_idx else [])
        assert len(got) == nslots
        if ordered:
            assert msgspec.json.encode(got) == msgspec.json.encode(sort_rows(list(got)))
            keys = [(-r.score, -r.hit_tokens, r.worker_id) for r in got]
            assert keys == sorted(keys)
        else:
            assert [r.worker_id for r in got] == wids
        for r, lab in zip(sorted(got, key=lambda r: r.worker_id), labs, strict=True):
            assert (r.hit_tokens, r.hit_tokens_gpu) == (lab[0], lab[1])
            if lab[1] >= lab[0]:
                assert r.score == float(lab[0])


def test_merged_gpu_attrs_equal_merged_dicts() -> None:
    """An attr given as (same, keep, gpu) -- the GPU view merged in C -- labels every
    member as ``bits._merge``'s dict does: members in ``keep`` by ``same``, the others by
    ``gpu`` (bitsets one bit above their positions)."""
    from router.score.bits import _merge

    rng = random.Random(6)
    for _ in range(150):
        nslots = rng.randrange(1, 140)
        slots = rng.sample(range(nslots), k=rng.randrange(1, nslots + 1))
        slots.sort()
        wids = [f"w{s:03d}" for s in slots]
        order = [4 * s for s in slots]
        keep = sum(1 << (4 * s) for s in slots if rng.random() < 0.5)
        same: dict[int, int] = {}
        gpu: dict[int, int] = {}
        for s in slots:
            v = rng.choice([0, 16, 32, 48, 64])
            same[v] = same.get(v, 0) | 1 << (4 * s)
            if not keep >> (4 * s) & 1:
                v = rng.choice([0, 16, 32])
                gpu[v] = gpu.get(v, 0) | 1 << (4 * s + 1)

        def make(key: tuple[int, ...]) -> tuple[int, int, float | None, list[GroupRow]]:
            return key[0], key[1], float(key[1]), []

        nbytes = (4 * nslots + 7) // 8
        got, _ = core.rows(WorkerRow, wids, order, [same, (same, keep, gpu)], nbytes, {}, make, 0)
        merged = _merge(same, keep, gpu)
        want, _ = core.rows(WorkerRow, wids, order, [same, merged], nbytes, {}, make, 0)
        assert msgspec.json.encode(got) == msgspec.json.encode(want)
        labs = _labels([same, merged], nslots, order)
        assert [(r.hit_tokens, r.hit_tokens_gpu) for r in got] == [tuple(x) for x in labs]


def test_windows_equal_the_python_accepts(python_core: None) -> None:
    """``windows``: every sliding window's AND as ``bits.accepts`` computes it, on random
    bitsets where most blocks are held by the same or nested sets of slots (the operand
    handed back) and some by unrelated ones, every window width and length."""
    from router.score.bits import accepts

    rng = random.Random(8)
    for _ in range(300):
        slots = rng.randrange(1, 300)
        base = rng.getrandbits(slots)
        vals = []
        for _ in range(rng.randrange(0, 60)):
            r = rng.random()
            v = base if r < 0.4 else base & rng.getrandbits(slots) if r < 0.7 else 0
            vals.append(v if r < 0.9 else rng.getrandbits(slots))
        width = rng.randrange(1, 20)
        assert core.windows(vals, width) == accepts(vals, "sliding", width)
    with pytest.raises(ValueError):
        core.windows([1], 0)


def test_spec_prototypes_equal_make_proto() -> None:
    """``rows`` given a spec builds each class's prototype in C (proto.c): hits, group
    rows and the all-GPU score (float, rounded as Python rounds) equal to
    ``make_proto``'s, on random keys, shapes and tier weights; offloaded hits unscored."""
    rng = random.Random(9)
    for trial in range(200):
        g_n = rng.randrange(1, 4)
        shapes = []
        for _ in range(g_n):
            bs = rng.choice([1, 16, 32, 48])
            shapes.append((bs, rng.choice(["full", "sliding", "mamba"]), rng.randrange(1, 9)))
        n_attrs = 2 + 2 * g_n
        fixed = [
            (g, rng.choice(["full_attention", None]), shapes[g][0], 2 + g, 2 + g_n + g)
            for g in range(g_n)
        ]
        weight = [0.0] * 16
        weight[1], weight[2], weight[4] = (rng.choice([1.0, 0.7, 1.3, 0.1]) for _ in range(3))
        spec = proto_spec(GroupRow, 0, 1, fixed, shapes, weight)
        nslots = rng.randrange(1, 40)
        slots = list(range(nslots))
        wids = [f"w{s:03d}" for s in slots]
        order = [4 * s for s in slots]
        attrs = []
        for a in range(n_attrs):
            classes: dict[int, int] = {}
            for s in slots:
                v = rng.randrange(0, 2000) if a != 1 else rng.choice([0, 48, 96, 2000])
                classes[v] = classes.get(v, 0) | 1 << (4 * s)
            attrs.append(classes)
        memo: dict[tuple[int, ...], object] = {}
        got, mixed = core.rows(
            WorkerRow, wids, order, attrs, (4 * nslots + 7) // 8, memo, spec, trial % 2 == 0
        )
        ref = proto_spec(GroupRow, 0, 1, fixed, shapes, weight)
        for key, proto in memo.items():
            assert msgspec.json.encode(proto) == msgspec.json.encode(make_proto(ref, key))
        assert spec[6] == ref[6]  # the all-GPU scores cached alike
        assert len(got) + len(mixed) == nslots
    with pytest.raises(TypeError):
        core.rows(WorkerRow, ["w"], [0], [{0: 1}], 1, {}, (GroupRow, 0), False)


def test_tiers_equal_the_python_count() -> None:
    """``tiers``: per slot, blocks of its ranges on GPU and on CPU only, read from the
    bitset ints as ``router.score.tiers.tier_counts``'s byte rows count them."""
    rng = random.Random(8)
    for _ in range(50):
        nslots, groups = rng.randrange(1, 80), rng.randrange(1, 3)
        vals = [
            [rng.getrandbits(4 * nslots) for _ in range(rng.randrange(0, 40))]
            for _ in range(groups)
        ]
        slots = rng.sample(range(nslots), rng.randrange(0, min(nslots, 10) + 1))
        starts, ends = [], []
        for v in vals:
            e = [rng.randrange(0, len(v) + 1) for _ in slots]
            starts.append([rng.randrange(0, x + 1) for x in e])
            ends.append(e)
        want_g, want_c = [0] * len(slots), [0] * len(slots)
        for v, b, e in zip(vals, starts, ends, strict=True):
            for j, s in enumerate(slots):
                for x in v[b[j] : e[j]]:
                    gpu, cpu = x >> (4 * s + 1) & 1, x >> (4 * s + 2) & 1
                    want_g[j] += gpu
                    want_c[j] += cpu and not gpu
        got = core.tiers(vals, starts, ends, [4 * s for s in slots])
        assert got == (want_g, want_c)
    with pytest.raises(IndexError):
        core.tiers([[1, 2]], [[0]], [[3]], [0])


def test_sweep_equals_the_python_sweep(python_core: None) -> None:
    """``sweep``: ``router.score.bits.sweep``'s candidate search per class of slots,
    insertion order of the answer included (big bitsets, ALL at candidate 0)."""
    from router.score.bits import ALL, sweep

    rng = random.Random(9)
    for _ in range(200):
        width, step = 4 * rng.randrange(1, 300), rng.choice([16, 32])
        cand = [ALL] + [
            rng.getrandbits(width) & rng.getrandbits(width) for _ in range(rng.randrange(0, 60))
        ]
        slots = rng.sample(range(width), rng.randrange(0, min(width, 40)))
        classes: dict[int, int] = {}
        for s in slots:
            cap = step * rng.randrange(0, len(cand) + 3)
            classes[cap] = classes.get(cap, 0) | 1 << s
        order = sorted(((cap // step, bits) for cap, bits in classes.items()), reverse=True)
        want = sweep(classes, cand, step)
        got = core.sweep(order, cand, step)
        assert got == want and list(got) == list(want)
