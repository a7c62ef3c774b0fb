"""The read side: the score formula, weights, ordering, mixed block sizes, edge lengths."""

from __future__ import annotations

from array import array

import msgspec
import pytest
import xxhash
from _kv_streams import EventSource, Harness, tokens

from router.index import make_index
from router.ingest.block_keys import chain_keys, request_keys, root_digest
from router.score.scorer import GroupRow, Scorer, ScoreResult, WorkerRow
from schemas.rest import GroupScore, ScoreResponse, WorkerScore

BS = 16


@pytest.fixture
def harness() -> Harness:
    return Harness.build(make_index("memory"))


async def test_tier_weights_default_and_configured(harness: Harness) -> None:
    src = EventSource()
    toks = tokens(8 * BS + 1)
    await harness.feed(
        "w",
        src.store(toks, BS, 0, 8),
        src.store(toks, BS, 0, 8, medium="CPU"),
        src.store(toks, BS, 0, 8, medium="STORAGE"),
    )
    await harness.feed("w", src.remove(toks, BS, range(2, 8)))
    await harness.feed("w", src.remove(toks, BS, range(5, 8), medium="CPU"))
    got = await harness.one(toks, "w")
    # blocks 0-1 GPU, 2-4 CPU, 5-7 STORAGE only
    assert (got.hit_tokens, got.hit_tokens_gpu) == (128, 32)
    assert got.score == pytest.approx(128 * (2 * 1.0 + 3 * 0.8 + 3 * 0.5) / 8, abs=1e-3)
    custom = Scorer(harness.index, tier_weights={"CPU": 0.25, "STORAGE": 0.0})
    res = await custom.score(toks, ["w"])
    assert res.workers[0].score == pytest.approx(128 * (2 + 0.75) / 8, abs=1e-3)
    # A GPU-only hit never scores below its own token count.
    low = Scorer(harness.index, tier_weights={"CPU": 0.0, "STORAGE": 0.0})
    assert (await low.score(toks, ["w"])).workers[0].score == 32


async def test_order_is_best_first_and_every_worker_appears(harness: Harness) -> None:
    src = EventSource()
    toks = tokens(8 * BS + 1)
    await harness.feed("deep", src.store(toks, BS, 0, 8))
    await harness.feed("cpu", src.store(toks, BS, 0, 8, medium="CPU"))
    await harness.feed("b-short", src.store(toks, BS, 0, 2))
    await harness.feed("a-short", src.store(toks, BS, 0, 2))
    res = await harness.score(toks, ["a-short", "cpu", "nobody", "b-short", "deep"])
    assert res.request_tokens == len(toks)
    assert [w.worker_id for w in res.workers] == ["deep", "cpu", "a-short", "b-short", "nobody"]
    assert [w.hit_tokens for w in res.workers] == [128, 128, 32, 32, 0]
    assert (await harness.score(toks, [])).workers == []


async def test_identical_patterns_share_work_but_not_identity(harness: Harness) -> None:
    src = EventSource()
    toks = tokens(6 * BS + 1)
    for w in ("x", "y"):
        await harness.feed(w, src.store(toks, BS, 0, 6))
    await harness.feed("z", src.store(toks, BS, 0, 3))
    res = await harness.score(toks, ["x", "y", "z"])
    assert [(w.worker_id, w.hit_tokens) for w in res.workers] == [("x", 96), ("y", 96), ("z", 48)]


async def test_mixed_block_sizes_align_to_the_lcm(harness: Harness) -> None:
    src = EventSource()
    toks = tokens(10 * BS + 1)
    await harness.feed(
        "w",
        src.store(toks, 16, 0, 10, group=0, kind="full_attention"),
        src.store(toks, 32, 0, 5, group=1, kind="full_attention"),
    )
    got = await harness.one(toks, "w")
    assert got.hit_tokens == 160
    await harness.feed("w", src.remove(toks, 16, [9], group=0))  # 144 is not a multiple of 32
    got = await harness.one(toks, "w")
    assert got.hit_tokens == 128
    assert [(g.block_size, g.hit_tokens) for g in got.groups] == [(16, 128), (32, 160)]


async def test_block_sizes_learned_after_the_first_score(harness: Harness) -> None:
    """A block size the scorer never hashed is picked up in the same request."""
    src = EventSource()
    toks = tokens(4 * 32 + 1)
    await harness.feed("a", src.store(toks, 16, 0, 8))
    assert (await harness.one(toks, "a")).hit_tokens == 128
    await harness.feed("b", src.store(toks, 32, 0, 4))
    res = await harness.score(toks, ["a", "b"])
    assert {w.worker_id: w.hit_tokens for w in res.workers} == {"a": 128, "b": 128}


@pytest.mark.parametrize(("length", "expected"), [(0, 0), (1, 0), (16, 0), (17, 16), (64, 48)])
async def test_request_length_cap(harness: Harness, length: int, expected: int) -> None:
    src = EventSource()
    toks = tokens(64)
    await harness.feed("w", src.store(toks, BS, 0, 4))
    res = await harness.score(toks[:length], ["w"])
    assert res.request_tokens == length
    assert res.workers[0].hit_tokens == expected


async def test_sliding_window_longer_than_the_hit_needs_every_block(harness: Harness) -> None:
    src = EventSource()
    toks = tokens(6 * BS + 1)
    await harness.feed(
        "w",
        src.store(toks, BS, 0, 6, group=0, kind="full_attention"),
        src.store(toks, BS, 0, 6, group=1, kind="sliding_window", window=1024),
    )
    await harness.feed("w", src.remove(toks, BS, [0], group=1))
    got = await harness.one(toks, "w")
    assert got.hit_tokens == 0  # the window covers the whole prefix, block 0 is gone
    assert [g.hit_tokens for g in got.groups] == [96, 0]


def test_result_structs_mirror_the_rest_models() -> None:
    """The Structs /v1/score encodes must keep the pydantic models' fields and order."""
    pairs = [(GroupRow, GroupScore), (WorkerRow, WorkerScore), (ScoreResult, ScoreResponse)]
    for struct, model in pairs:
        assert struct.__struct_fields__ == tuple(model.model_fields)


async def test_encoded_result_equals_the_validated_model_json(harness: Harness) -> None:
    """What /v1/score sends (``msgspec.json.encode`` of ``score_result``) is byte for byte
    the JSON of the pydantic ``ScoreResponse``: learned, unlearned, gapped and offloaded
    workers, mixed block sizes, fractional scores."""
    src = EventSource()
    toks = tokens(12 * BS + 5)
    await harness.feed("gpu", src.store(toks, BS, 0, 12))
    await harness.feed(
        "mixed",
        src.store(toks, BS, 0, 12, group=0, kind="full_attention"),
        src.store(toks, 2 * BS, 0, 6, group=1, kind="sliding_window", window=64),
        src.store(toks, BS, 0, 12, group=0, kind="full_attention", medium="CPU"),
        src.store(toks, 2 * BS, 0, 6, group=1, kind="sliding_window", window=64, medium="CPU"),
    )
    await harness.feed("mixed", src.remove(toks, BS, range(3, 12), group=0))
    await harness.feed("gapped", src.store(toks, BS, 0, 4, group=1, kind="full_attention"))
    await harness.feed("cpu", src.store(toks, BS, 0, 7, medium="CPU"))
    await harness.feed("cpu", src.store(toks, BS, 0, 3, medium="STORAGE"))
    workers = ["gpu", "mixed", "gapped", "cpu", "nobody", "gpu"]
    for length in (0, 1, 40, len(toks)):
        for scorer in (harness.scorer, Scorer(harness.index, tier_weights={"CPU": 0.3333})):
            model = await scorer.score(toks[:length], workers)
            result = await scorer.score_result(toks[:length], workers)
            assert msgspec.json.encode(result) == model.model_dump_json().encode()
    scores = {w.worker_id: w.score for w in model.workers}
    assert scores["cpu"] != int(scores["cpu"])  # a fractional score was compared too
    assert not next(w for w in model.workers if w.worker_id == "gapped").learned


@pytest.mark.parametrize("bs", [1, 16, 32])
def test_request_keys_fast_path_equals_the_per_block_chain(bs: int) -> None:
    """The hot path (one struct.pack, one C call per block) keys blocks exactly like
    the plain per-block definition ``xxh3_64(int32 tokens, seed=parent)``; tokens that
    do not fit in int32 take the per-block path and still chain."""
    toks = tokens(7 * bs + 3, seed=bs)
    n = len(toks) // bs
    key = int.from_bytes(root_digest("lora", "salt"), "big")
    want = []
    for i in range(n):
        key = xxhash.xxh3_64_intdigest(array("i", toks[i * bs : (i + 1) * bs]).tobytes(), key)
        want.append(key)
    assert request_keys(toks, bs, "lora", "salt") == want
    assert chain_keys(root_digest("lora", "salt"), toks, bs, n, [None] * n) == want
    wide = [*toks[:bs], 2**40, *toks[bs + 1 :]]
    got = request_keys(wide, bs, "lora", "salt")
    assert got[0] == want[0] and len(got) == n and len(set(got[1:]) & set(want)) == 0


@pytest.mark.parametrize("cpu_weight", [0.8, 2.0, 0.0, 1.0])
async def test_single_tier_weight_matches_the_blockwise_sum(
    harness: Harness, cpu_weight: float
) -> None:
    """A hit held on one tier throughout scores exactly like the block-by-block sum,
    integral weights (the w * k shortcut) and fractional ones alike."""
    src = EventSource()
    toks = tokens(9 * BS + 1)
    await harness.feed("w", src.store(toks, BS, 0, 9, medium="CPU"))
    scorer = Scorer(harness.index, tier_weights={"CPU": cpu_weight})
    got = (await scorer.score(toks, ["w"])).workers[0]
    assert got.hit_tokens == 144 and got.hit_tokens_gpu == 0
    blockwise = sum([cpu_weight] * 9)
    assert got.score == round(144 * blockwise / 9, 3)
