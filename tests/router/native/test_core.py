"""The compiled core (router/native/_core.c) against the Python it replaces: a dict, the
block-key chain of router.ingest.block_keys, int.to_bytes, and the index's store and
remove loops (``router.index.memory_loops``; the scorer's loops: test_core_score.py)."""

from __future__ import annotations

import random

import pytest

from router import native
from router.index.base import GPU_BIT, RemoveOp, StoreOp
from router.index.memory_loops import remove_loop, store_loop
from router.ingest.block_keys import chain_keys, root_digest
from router.score.bits import prefix_classes

pytestmark = pytest.mark.skipif(not native.available(), reason="compiled core not built")
core = native._core


def _random_key(rng: random.Random) -> object:
    return rng.choice(
        [
            *(rng.randrange(1, 500), 0, -5, 2**64 + 3, 2**64 - 1, b"hash", rng.randrange(2**64)),
            # around the digit boundaries the in-place conversion reads (30-bit digits)
            *(2**30 - 1, 2**30, 2**60 - 1, 2**60, 2**63, 2**64, 2**90 + 1, -(2**62)),
        ]
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
        v = rng.choice([rng.randrange(2**64), -1, 2**70, 7, 2**64, 2**60, 0])
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
            solo = (1 | 1 << field) << (4 * slot)
            n = rng.randrange(0, 12)
            bad = [b"h%d" % rng.randrange(9)] if emap_kind in ("native", "dict") else []
            hashes = [rng.choice([rng.randrange(1, 60), *bad]) for _ in range(n)]
            keys = [rng.randrange(1, 80) for _ in range(n)]
            if emap_kind == "odd" and n and rng.random() < 0.05:
                keys[0] = rng.choice([0, 2**64 + 3])
            got = t.store(emap, hashes, keys, 4 * slot, 4 * slot + field, b | anyb, solo)
            op = StoreOp(0, GPU_BIT, hashes, keys)
            assert got == store_loop(ref_t, ref_emap, op, b, anyb, solo)
        assert dict(t.items()) == ref_t
        assert dict(emap.items()) == ref_emap


def _remove_ref(t, emap, hashes, pos, field, siblings):  # type: ignore[no-untyped-def]
    """MemoryIndex.apply's Python RemoveOp loop (no extra copies), on dicts."""
    anyb = 1 << pos
    new, fresh, _, gone = remove_loop(
        t, emap, RemoveOp(0, GPU_BIT, hashes), anyb << field, anyb, {}, siblings
    )
    return new, fresh, gone


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
