"""The fast path (``router.ingest.fast_path``) against the general planner: random
streams, mostly the simple kind with every complication mixed in, applied through two
ingestors -- one with the fast path, one without -- must leave the same index, counters,
metadata and recent token ranges."""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import msgspec
import pytest

from router import native
from router.index import make_index
from router.index.memory import MemoryIndex
from router.ingest import fast_path, packed
from router.ingest.ingestor import Ingestor
from schemas import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    DecodeStats,
    KVEventBatch,
    decode_batch,
    encode_batch,
)
from schemas.decode import PackedBlockStored

BS = 16


@pytest.fixture(params=["native", "python"])
def core(request: pytest.FixtureRequest) -> Iterator[None]:
    before = native.ACTIVE != "python"
    if request.param == "native" and not native.available():
        pytest.skip("compiled core not built")
    native.set_active(request.param == "native")
    yield
    native.set_active(before)


def _stream(seed: int, n_workers: int = 3, n_batches: int = 300) -> list[Any]:
    """(worker, batch, marks) items: dense chained stores of two groups (the simple
    kind) and removals, with odd events mixed in (salts, extra keys, sparse and
    offloaded stores, other block sizes, unknown and partly named parents, clears)."""
    rng = random.Random(seed)
    pool = [rng.randrange(1000) for _ in range(4096)]
    alive: list[list[int]] = [[] for _ in range(n_workers)]
    seq = [0] * n_workers
    out: list[Any] = []
    for _ in range(n_batches):
        w = rng.randrange(n_workers)
        events: list[Any] = []
        for _ in range(rng.randint(1, 4)):
            roll = rng.random()
            if roll < 0.2 and alive[w]:
                gone = rng.sample(alive[w], min(len(alive[w]), rng.randint(1, 6)))
                gone += [rng.getrandbits(64)] if rng.random() < 0.1 else []
                for g in (0, 1):
                    events.append(BlockRemoved(gone, rng.choice(["GPU", "GPU", None, "CPU"]), g))
                if rng.random() < 0.8:
                    alive[w] = [h for h in alive[w] if h not in gone]
                continue
            if roll < 0.205:
                events.append(AllBlocksCleared())
                alive[w] = []
                continue
            k = rng.randint(1, 8)
            parent = rng.choice(alive[w]) if alive[w] and rng.random() < 0.6 else None
            if rng.random() < 0.05:
                parent = rng.getrandbits(64)  # never stored
            hashes = [rng.getrandbits(64) for _ in range(k)]
            if alive[w] and rng.random() < 0.05:
                hashes[-1] = rng.choice(alive[w])  # partly named
            off = rng.randrange(len(pool) - k * BS)
            toks = pool[off : off + k * BS]
            kw: dict[str, Any] = {}
            odd = rng.random() * 2.5  # below 0.16: an odd store
            bs, medium, lora, extra = BS, "GPU", None, None
            if odd < 0.04:
                lora = "adapter"
            elif odd < 0.08:
                kw["cache_salt"] = "salt"
            elif odd < 0.11:
                extra = [[("mm", rng.randrange(3))]] * k
            elif odd < 0.14:
                medium = "CPU"
            elif odd < 0.16:
                bs = 2 * BS  # another block size: a new hash unit stays 16
                toks = toks + toks
            elif 2.3 < odd < 2.38 and k > 1:
                hashes[-1] = hashes[0]  # a hash twice in one store
            for g in (0, 1):
                if g == 1 and rng.random() < 0.1:
                    continue  # a step whose sliding-window group skipped the store
                hs = hashes if not (g == 1 and odd > 2.45) else hashes[1:]  # sparse
                events.append(
                    BlockStored(
                        hs,
                        parent,
                        toks,
                        bs,
                        None,
                        medium,
                        lora,
                        extra,
                        g,
                        "full_attention" if g == 0 else "sliding_window",
                        None if g == 0 else 64,
                        **kw,
                    )
                )
            alive[w] += hashes
        marks: list[tuple[int, int, int, int]] = []
        if rng.random() < 0.5:
            seq[w] += rng.choice([1, 1, 1, 0])  # sometimes a repeated seq (skipped)
            marks.append((0, 0, seq[w], rng.getrandbits(32)))
        out.append((f"w{w}", KVEventBatch(float(len(out)), events), marks))
    return out


def _state(ing: Ingestor) -> dict[str, Any]:
    index = ing.index
    assert isinstance(index, MemoryIndex)
    tables = {g: dict(t.items()) for g, t in index._tables.items()}
    workers = {
        wid: (
            {bs: dict(m.items()) for bs, m in w.maps.items()},
            {bs: [dict(x) for x in gens] for bs, gens in w.ghosts.items()},
            w.counts,
            w.entries,
            w.copies,
            w.seqs,
            w.state,
            w.slot,
        )
        for wid, w in index._workers.items()
    }
    recent = {w: [(packed.tokens(t), list(u)) for t, u in r] for w, r in ing._recent.items()}
    return {"tables": tables, "workers": workers, "recent": recent, "counters": ing.counters}


async def _run(items: list[Any], enabled: bool, drain: int) -> tuple[dict[str, Any], int]:
    was = fast_path.ENABLED
    fast_path.ENABLED = enabled
    taken = 0
    real = fast_path.plan_simple

    async def counting(*args: Any) -> bool:
        nonlocal taken
        got = await real(*args)
        taken += got
        return got

    fast_path.plan_simple = counting  # type: ignore[assignment]
    try:
        import router.ingest.ingestor as ingestor_mod

        ingestor_mod.plan_simple = counting  # type: ignore[assignment]
        ing = Ingestor(make_index("memory"))
        for lo in range(0, len(items), drain):
            await ing.apply_batches(items[lo : lo + drain])
    finally:
        fast_path.ENABLED = was
        fast_path.plan_simple = real  # type: ignore[assignment]
        ingestor_mod.plan_simple = real  # type: ignore[assignment]
    return _state(ing), taken


@pytest.mark.parametrize("seed", range(6))
async def test_fast_path_equals_the_general_path(core: None, seed: int) -> None:
    items = _stream(seed)
    drain = 1 + seed % 3  # batches of several workers in one call share ``known``
    fast, taken = await _run(items, True, drain)
    slow, none = await _run(items, False, drain)
    assert none == 0
    assert taken > len(items) // 4, taken  # much of the stream is the simple kind
    assert taken < len(items)  # and some batches need the general path
    assert fast["counters"] == slow["counters"]
    assert fast["recent"] == slow["recent"]
    assert fast["workers"] == slow["workers"]
    assert fast["tables"] == slow["tables"]


def _merged_backlog(n_batches: int = 12) -> tuple[KVEventBatch, list[tuple[int, int, int, int]]]:
    """Published batches of one fresh worker (dense chained stores of two groups and
    removals) merged the way ``router.ingest.writer`` stages a backlog."""
    rng = random.Random(3)
    events: list[Any] = []
    marks: list[tuple[int, int, int, int]] = []
    tip: int | None = None
    stored: list[int] = []
    for seq in range(n_batches):
        marks.append((len(events), 0, seq, seq))
        hashes = [rng.getrandbits(64) for _ in range(rng.randint(1, 6))]
        toks = [rng.randrange(1000) for _ in range(len(hashes) * BS)]
        for g in (0, 1):
            events.append(BlockStored(hashes, tip, toks, BS, None, "GPU", None, None, g))
        if seq % 4 == 3:
            events += [BlockRemoved(stored[:2], "GPU", g) for g in (0, 1)]
            stored = stored[2:]
        stored += hashes
        tip = hashes[-1]
    return KVEventBatch(0.0, events), marks


async def test_a_merged_backlog_takes_the_fast_path_after_its_first_batch(core: None) -> None:
    """A fresh worker's hash mode is unknown until its first chain is checked: the first
    published batch of a merged backlog goes the general way, the rest the fast way (it
    was all general), with the same result as the general path for all of it."""
    batch, marks = _merged_backlog()
    fast, taken = await _run([("w0", batch, marks)], True, 1)
    slow, _ = await _run([("w0", batch, marks)], False, 1)
    assert taken == 1
    assert fast["counters"] == slow["counters"]
    assert fast["recent"] == slow["recent"]
    assert fast["workers"] == slow["workers"]
    assert fast["tables"] == slow["tables"]


@pytest.mark.parametrize("rewrite", [True, False], ids=["int32", "msgpack"])
@pytest.mark.parametrize("seed", range(3))
async def test_packed_batches_leave_what_plain_ones_do(
    core: None, seed: int, rewrite: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The subscriber's packed decode (``router.ingest.packed``) of the same payloads:
    the fast path chains from the bytes (the ids as int32s, or where the core's rewrite
    is off their msgpack bytes), the general path gets them unpacked; the index,
    counters and metadata end the same, and so do the recent token ranges once read."""
    if not rewrite:
        monkeypatch.setattr(native, "int32_tokens", None)
    items = _stream(seed)
    payloads = [(w, encode_batch(b), m) for w, b, m in items]
    got = [(w, packed.decode(p), m) for w, p, m in payloads]
    if native.packed_len is None:  # the core is off (or built without it): as before
        assert all(b is None for _, b, _ in got)
        return
    assert all(b is not None for _, b, _ in got)
    kinds = {
        type(e.token_ids)
        for _, b, _ in got
        for e in b.events  # type: ignore[union-attr]
        if type(e) is PackedBlockStored
    }
    assert kinds == ({bytes} if rewrite else {msgspec.Raw})
    for (_, p, _), (_, b, _) in zip(payloads, got, strict=True):
        assert packed.unpack(b) == decode_batch(p)  # type: ignore[arg-type]
    drain = 1 + seed % 3
    plain, taken = await _run(items, True, drain)
    fast, taken_packed = await _run(got, True, drain)
    assert taken_packed == taken
    assert fast == plain


def test_packed_decode_leaves_odd_tokens_to_the_usual_decode(core: None) -> None:
    """Token ids that are not int32 (wider ints, other types) leave the packed decode;
    ``decode_batch`` then keeps wide ints and counts a malformed event as before."""
    ev = BlockStored([1], None, [5] * BS, BS, None, "GPU", None, group_idx=0)
    for toks, malformed in (([2**40] * BS, 0), (["x"] * BS, 1)):
        payload = encode_batch(KVEventBatch(0.0, [msgspec.structs.replace(ev, token_ids=toks)]))
        assert packed.decode(payload) is None
        stats = DecodeStats()
        batch = decode_batch(payload, stats)
        assert stats.malformed_events == malformed
        assert len(batch.events) == 1 - malformed
    good = packed.decode(encode_batch(KVEventBatch(0.0, [ev])))
    assert (good is not None) == (native.packed_len is not None)


async def test_odd_removals_on_the_fast_path(core: None) -> None:
    """Removals with a group no engine sends, an aliased medium, an unknown medium, or
    a group the worker never stored in: counted as the general path counts them."""
    hashes = [11, 12, 13]
    toks = list(range(3 * BS))
    store = [BlockStored(hashes, None, toks, BS, None, None, None, None, g) for g in (0, 1)]
    odd: list[Any] = [
        BlockRemoved([11], "GPU", -1),
        BlockRemoved([12], "DISK", 0),
        BlockRemoved([12], "BOGUS", 1),
        BlockRemoved([13], None, 7),
        BlockRemoved([13], "GPU", 1),
        BlockRemoved([11], None, None),
    ]
    more = [BlockStored([14], 13, toks[:BS], BS, None, "GPU", None, None, g) for g in (0, 1)]
    items = [
        ("w0", KVEventBatch(0.0, store), [(0, 0, 0, 0)]),
        ("w0", KVEventBatch(1.0, odd + more), [(0, 0, 1, 0)]),
    ]
    fast, taken = await _run(items, True, 1)
    slow, _ = await _run(items, False, 1)
    assert taken == 1
    assert fast["counters"].bad_events == 2  # the group -1 and the unknown medium
    assert fast == slow
