"""The compiled core (router/native/_core.c) against the Python it replaces: a dict, the
block-key chain of router.ingest.block_keys, int.to_bytes, and the scorer's loops."""

from __future__ import annotations

import random
from collections.abc import Iterator

import msgspec
import pytest

from router import native
from router.ingest.block_keys import chain_keys, root_digest
from router.score.bits import prefix_classes
from router.score.protos import labels as _labels
from router.score.protos import make_proto, proto_spec
from router.score.rows import GroupRow, WorkerRow, sort_rows

pytestmark = pytest.mark.skipif(not native.available(), reason="compiled core not built")
core = native._core


@pytest.fixture
def python_core() -> Iterator[None]:
    before = native.ACTIVE != "python"
    native.set_active(False)
    yield
    native.set_active(before)


def _random_key(rng: random.Random) -> object:
    return rng.choice(
        [rng.randrange(1, 500), 0, -5, 2**64 + 3, 2**64 - 1, b"hash", rng.randrange(2**64)]
    )


@pytest.mark.parametrize("u64_values", [False, True])
def test_u64map_answers_like_a_dict(u64_values: bool) -> None:
    """Random inserts, deletes, gets and setdefaults on colliding small keys, keys the
    table cannot hold natively (0, negative, > 64 bits, bytes) and values that do not
    fit uint64 (kept on the side): every answer and the final contents equal a dict's."""
    rng = random.Random(7)
    m, d = core.U64Map(u64_values=u64_values), {}
    for _ in range(30_000):
        op = rng.random()
        k = _random_key(rng)
        v = rng.choice([rng.randrange(2**64), -1, 2**70, 7])
        if op < 0.4:
            m[k] = v
            d[k] = v
        elif op < 0.6:
            assert (k in m) == (k in d)
            if k in d:
                assert m.pop(k) == d.pop(k)
            else:
                with pytest.raises(KeyError):
                    del m[k]
        elif op < 0.8:
            assert m.get(k, "none") == d.get(k, "none")
        else:
            assert m.setdefault(k, v) == d.setdefault(k, v)
        assert len(m) == len(d)
    assert sorted(map(repr, m.items())) == sorted(map(repr, d.items()))
    assert sorted(map(repr, m)) == sorted(map(repr, d.keys()))
    assert sorted(map(repr, m.values())) == sorted(map(repr, d.values()))
    m.clear()
    assert len(m) == 0 and not m and m.get(1) is None


def test_prefix_and_lookup_equal_the_python_forms() -> None:
    """``prefix``: the running AND with early exit of router/score/bits.py, as its prefix
    classes; ``lookup``: the values with a default; across batch boundaries, with
    side-dict keys and with runs of equal values."""
    from functools import reduce
    from itertools import accumulate, islice, repeat, takewhile
    from operator import and_, or_

    rng = random.Random(3)
    for trial in range(300):
        d: dict[object, int] = {}
        m = core.U64Map()
        keys = [rng.randrange(1, 2**64) for _ in range(rng.randrange(0, 120))]
        if keys and trial % 5 == 0:
            keys[rng.randrange(len(keys))] = -7  # a side-dict key
        init = rng.randrange(1, 2**12)
        for i, k in enumerate(keys):
            if rng.random() < 0.97:
                v = init | rng.randrange(2**12) if i < len(keys) * 0.8 else rng.randrange(2**12)
                if i and rng.random() < 0.3:  # a run of equal values (shared holders)
                    v = d.get(keys[i - 1], v)
                d[k] = m[k] = v
        get = d.get
        pa = list(takewhile(bool, accumulate(map(get, keys, repeat(0)), and_, initial=init)))
        vals = list(map(get, islice(keys, len(pa) - 1)))
        classes, got_vals, any_bits = m.prefix(keys, init)
        assert list(classes.items()) == list(prefix_classes(pa).items())  # order too
        assert (got_vals, any_bits) == (vals, reduce(or_, vals, 0))
        n = rng.randrange(0, len(keys) + 2)
        assert m.lookup(keys, n, 0) == [d.get(k, 0) for k in keys[:n]]


@pytest.mark.skipif(not hasattr(core, "chain"), reason="built without libxxhash")
def test_chain_equals_the_python_chain(python_core: None) -> None:
    rng = random.Random(1)
    parent = root_digest("lora", "salt")
    seed = int.from_bytes(parent, "big")
    for _ in range(200):
        bs = rng.choice([1, 4, 16, 32])
        n = rng.randrange(0, 40)
        toks = [rng.randrange(-(2**31), 2**31) for _ in range(n * bs + rng.randrange(3))]
        assert core.chain(seed, toks, bs, n) == chain_keys(parent, toks, bs, n)
    # Tokens outside int32 or not ints: None, the Python path's per-block encoding.
    assert core.chain(seed, [2**31], 1, 1) is None
    assert core.chain(seed, ["x"], 1, 1) is None
    with pytest.raises(ValueError):
        core.chain(seed, [1, 2], 2, 2)


def test_pack_equals_to_bytes() -> None:
    rng = random.Random(2)
    for width in (0, 1, 3, 16, 33):
        ints = [rng.randrange(2 ** (8 * width)) if width else 0 for _ in range(50)]
        assert core.pack(ints, width) == b"".join(i.to_bytes(width, "little") for i in ints)
    with pytest.raises(OverflowError):
        core.pack([256], 1)
    with pytest.raises(OverflowError):
        core.pack([-1], 4)


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
        attrs = []
        for _ in range(rng.randrange(2, 5)):
            classes: dict[int, int] = {}
            for s in slots:
                v = rng.choice([0, 16, 32, 48])
                classes[v] = classes.get(v, 0) | 1 << (4 * s)
            attrs.append(classes)

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
        attrs = []
        for _ in range(3):
            classes: dict[int, int] = {}
            for s in slots:
                v = rng.choice([0, 16, 32, 48])
                classes[v] = classes.get(v, 0) | 1 << (4 * s)
            attrs.append(classes)

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


def test_store_equals_the_python_store_loop() -> None:
    """``U64Map.store``: MemoryIndex.apply's StoreOp loop (engine-hash map setdefault,
    bit set, copies of held blocks), on a native and on a dict engine-hash map."""
    rng = random.Random(6)
    # "ints": the uint64 fast path alone; "odd": keys 0 and wider than 64 bits too (the
    # general path for those blocks, then for the rest of the map's life).
    for emap_kind in ("native", "dict", "ints", "odd"):
        t, emap = core.U64Map(), {} if emap_kind == "dict" else core.U64Map(u64_values=True)
        ref_t: dict[int, int] = {}
        ref_emap: dict[object, int] = {}
        for _ in range(400):
            slot, field = rng.randrange(70), rng.randrange(1, 4)
            anyb = 1 << (4 * slot)
            b = anyb << field
            own = 0xF * anyb
            solo = (1 | 1 << field) << (4 * slot)
            n = rng.randrange(0, 12)
            bad = [b"h%d" % rng.randrange(9)] if emap_kind in ("native", "dict") else []
            hashes = [rng.choice([rng.randrange(1, 60), *bad]) for _ in range(n)]
            keys = [rng.randrange(1, 80) for _ in range(n)]
            if emap_kind == "odd" and n and rng.random() < 0.05:
                keys[0] = rng.choice([0, 2**64 + 3])
            got = t.store(emap, hashes, keys, 4 * slot, 4 * slot + field, b | anyb, solo)
            new = fresh = 0
            again = []
            for h, k in zip(hashes, keys, strict=True):
                k = ref_emap.setdefault(h, k)
                v = ref_t.get(k, 0)
                if not v & b:
                    fresh += not v & own
                    ref_t[k] = v | b | anyb if v else solo
                    new += 1
                else:
                    again.append(k)
            assert got == (new, fresh, again)
        assert dict(t.items()) == ref_t
        assert dict(emap.items()) == ref_emap


def _remove_ref(t, emap, hashes, pos, field, siblings):  # type: ignore[no-untyped-def]
    """MemoryIndex.apply's Python RemoveOp loop (no extra copies), on dicts."""
    anyb, own = 1 << pos, 0xF << pos
    b, media = anyb << field, own ^ anyb
    removed = fresh = 0
    gone = []
    for h in hashes:
        k = emap.get(h)
        v = 0 if k is None else t.get(k, 0)
        if not v & b:
            continue
        removed += 1
        v ^= b
        if not v & media:
            v ^= anyb
        if v:
            t[k] = v
        else:
            del t[k]
        if not v & own:
            fresh += 1
            if not any(s.get(k, 0) & own for s in siblings):
                del emap[h]
                gone.append((h, k))
    return removed, fresh, gone


def test_remove_equals_the_python_remove_loop() -> None:
    """``U64Map.remove``: MemoryIndex.apply's RemoveOp loop (bits cleared, entries and
    engine hashes dropped once no medium nor sibling group holds them), and None with
    nothing changed when a hash or a key is not a plain uint64."""
    rng = random.Random(7)
    for trial in range(60):
        t, emap, sib = core.U64Map(), core.U64Map(u64_values=True), core.U64Map()
        ref_t: dict[int, int] = {}
        ref_emap: dict[object, int] = {}
        ref_sib: dict[int, int] = {}
        slots = rng.sample(range(40), 3)
        for h in range(1, 120):
            k = rng.randrange(1, 90)
            emap[h] = ref_emap[h] = k
            for table, ref in ((t, ref_t), (sib, ref_sib)):
                v = ref.get(k, 0)
                for s in slots:
                    if rng.random() < 0.4:
                        v |= (1 | (1 << rng.randrange(1, 4))) << (4 * s)
                if v:
                    table[k] = ref[k] = v
        if trial % 10 == 9:
            emap[b"odd"] = ref_emap[b"odd"] = 5  # an entry on the side: not taken
        for _ in range(30):
            pos, field = 4 * rng.choice(slots), rng.randrange(1, 4)
            hashes = [rng.randrange(1, 130) for _ in range(rng.randrange(0, 20))]
            use_sib = rng.random() < 0.5
            got = t.remove(emap, hashes, pos, pos + field, 1 << (pos + field), 1 << pos,
                           [sib] if use_sib else [])  # fmt: skip
            if trial % 10 == 9:
                assert got is None and dict(t.items()) == ref_t
                continue
            assert got == _remove_ref(ref_t, ref_emap, hashes, pos, field,
                                      [ref_sib] if use_sib else [])  # fmt: skip
            assert dict(t.items()) == ref_t
            assert dict(emap.items()) == ref_emap
        assert t.remove(emap, [b"bytes"], 0, 1, 2, 1, []) is None


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
