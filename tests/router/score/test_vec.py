"""The all-workers-at-once score paths (memory index: bitsets, ``router.score.bits``,
and numpy columns, ``router.score.vec``) answer exactly like the per-worker path
(``Scorer._via_snapshots``: per-worker snapshots and ``schemas.hit_rule``) on random
fleets: holes, evicted window blocks, offloaded tails, mixed block sizes and layouts,
fewer than 8 worker slots and more than 64 (the bitset field widens)."""

from __future__ import annotations

import random

import msgspec
import pytest
from _kv_streams import EventSource, Harness, tokens

from router.index import make_index
from router.ingest.block_keys import request_keys
from router.ingest.placement import block_keys_at
from router.score.scorer import Scorer

BS = 16
LAYOUTS = {
    # full + sliding window of 4 blocks, one block size
    "swa": [(0, "full_attention", 16, None), (1, "sliding_window", 16, 64)],
    # mixed sizes: the hit step is 32
    "mamba": [
        (0, "full_attention", 16, None),
        (1, "sliding_window", 16, 48),
        (2, "mamba", 32, None),
    ],
    "full": [(0, "full_attention", 16, None)],
}


async def _fleet(
    harness: Harness, n_workers: int, layouts: list[str], seed: int
) -> list[list[int]]:
    rng = random.Random(seed)
    shared = tokens(64, seed=seed)
    prompts = [shared + tokens(20 * 16, seed=seed * 100 + j) for j in range(3)]
    for w in range(n_workers):
        layout = LAYOUTS[layouts[w % len(layouts)]]
        src = EventSource("engine")
        events: list[object] = []
        for toks in prompts:
            if rng.random() < 0.3:
                continue
            for g, kind, bs, window in layout:
                n = len(toks) // bs
                stop = rng.randint(1, n)
                medium = "GPU" if rng.random() < 0.7 else "CPU"
                events.append(
                    src.store(toks, bs, 0, stop, group=g, kind=kind, window=window, medium=medium)
                )
                if rng.random() < 0.5:  # holes: evicted blocks
                    gone = rng.sample(range(stop), k=rng.randint(1, max(1, stop // 3)))
                    events.append(src.remove(toks, bs, gone, group=g, medium=medium))
                if medium == "GPU" and rng.random() < 0.4:  # an offloaded tail
                    cut = rng.randrange(stop)
                    events.append(
                        src.store(
                            toks, bs, cut, stop, group=g, kind=kind, window=window, medium="CPU"
                        )
                    )
        await harness.feed(f"w{w}", *events)
    return prompts


@pytest.mark.parametrize("n_workers", [5, 13, 40, 70])
@pytest.mark.parametrize("layouts", [["swa"], ["swa", "mamba", "full"]])
@pytest.mark.parametrize("weights", [None, {"GPU": 0.9, "CPU": 0.3333}])
@pytest.mark.parametrize("bits", [True, False], ids=["bits", "columns"])
async def test_all_workers_paths_equal_the_per_worker_path(
    n_workers: int, layouts: list[str], weights: dict[str, float] | None, bits: bool
) -> None:
    index = make_index("memory")
    harness = Harness.build(index)
    compared = hits = mixed = 0
    for seed in range(6):
        await index.close()  # empties the index between fleets
        prompts = await _fleet(harness, n_workers, layouts, seed)
        scorer = Scorer(
            index, tier_weights=weights, columns_min_workers=0, bits=bits, bits_min_workers=0
        )
        workers = [f"w{w}" for w in range(n_workers)] + ["never-seen"]
        for toks in prompts:
            for length in (len(toks), 200, 17, 1):
                fast = await scorer.score_result(toks[:length], workers)
                ids = list(dict.fromkeys(workers))
                t = toks[:length]
                used = {bs: scorer._units.get(bs) or bs for bs in scorer._sizes}
                keys = {bs: _keys_for(t, bs, u) for bs, u in used.items()}
                slow = await scorer._via_snapshots(
                    ids, keys, used, lambda bs, u, t=t: _keys_for(t, bs, u), length
                )
                slow.sort(key=lambda r: (-r.score, -r.hit_tokens, r.worker_id))
                for a, b in zip(fast.workers, slow, strict=True):
                    assert msgspec.json.encode(a) == msgspec.json.encode(b), (length, seed)
                compared += 1
                hits += sum(1 for r in fast.workers if r.hit_tokens)
                mixed += sum(1 for r in fast.workers if r.score not in (0, r.hit_tokens))
    # The comparisons were about real hits, offloaded ones (fractional scores) included.
    assert compared == 6 * 3 * 4 and hits > 50 and mixed > 5


def _keys_for(toks: list[int], bs: int, unit: int | None) -> list[int]:
    """The scorer's keys for a block size read at a hash unit (``Scorer.score_result``)."""
    u = unit if unit and bs % unit == 0 else bs
    return block_keys_at(request_keys(toks, u), bs // u)


@pytest.mark.parametrize("n_workers", [3, 40, 70])
async def test_native_and_python_cores_answer_alike(n_workers: int) -> None:
    """The same random fleet fed to an index built on the compiled core (U64Map tables,
    C chain, C rows) and to one built on the pure-Python paths: every score is the same
    JSON, on every path (bits, columns, per worker)."""
    from router import native

    if not native.available():
        pytest.skip("the compiled core is not built here")
    before = native.ACTIVE != "python"
    answers: dict[bool, list[bytes]] = {}
    hits = 0
    try:
        for on in (True, False):
            native.set_active(on)
            index = make_index("memory")
            harness = Harness.build(index)
            got = answers[on] = []
            for seed in range(3):
                await index.close()
                prompts = await _fleet(harness, n_workers, ["swa", "mamba", "full"], seed)
                workers = [f"w{w}" for w in range(n_workers)] + ["never-seen"]
                scorers = [
                    Scorer(index, columns_min_workers=0, bits_min_workers=0),
                    Scorer(index, columns_min_workers=0, bits=False),
                    Scorer(index, columns=False),
                ]
                for scorer in scorers:
                    for toks in prompts:
                        for length in (len(toks), 200, 17):
                            res = await scorer.score_result(toks[:length], workers)
                            got.append(msgspec.json.encode(res))
                            hits += sum(r.hit_tokens > 0 for r in res.workers)
    finally:
        native.set_active(before)
    assert answers[True] == answers[False]
    assert hits > 20  # real hits were compared
