"""The write side on its own: golden vLLM payloads, hash-mode detection, learning, extras."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from _kv_streams import EventSource, Harness, tokens, wire

from router.index import make_index
from router.index.base import WorkerState
from router.ingest.block_keys import request_keys, split_extra_keys
from schemas import BlockStored, KVEventBatch, decode_batch

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "vllm-0.33"
CASES = ["single_group_ints", "hybrid_groups", "offload_cpu_bytes_hashes"]
CASES += ["lora_salt_extra_keys", "all_cleared"]


@pytest.fixture
def harness() -> Harness:
    return Harness.build(make_index("memory"))


def _fixture(kind: str, case: str) -> KVEventBatch:
    return decode_batch((FIXTURES / kind / f"{case}.msgpack").read_bytes())


@pytest.mark.parametrize("kind", ["events", "legacy"])
async def test_golden_vllm_payloads_apply_cleanly(harness: Harness, kind: str) -> None:
    for case in CASES:
        await harness.ingestor.apply_batch(case, _fixture(kind, case))
    c = harness.ingestor.counters
    assert (c.bad_events, c.unknown_parent, c.unresolved_blocks, c.events_unknown) == (0, 0, 0, 0)
    assert (c.events_stored, c.events_removed, c.events_cleared) == (6, 3, 1)
    hybrid = await harness.ingestor.worker_groups("hybrid_groups")
    assert (hybrid[0].kind, hybrid[0].blocks_by_medium) == ("full_attention", {"GPU": 4})
    assert (hybrid[1].kind, hybrid[1].sliding_window) == ("sliding_window", 32)
    assert hybrid[1].blocks_by_medium == {"GPU": 3}
    cpu = await harness.ingestor.worker_groups("offload_cpu_bytes_hashes")
    assert cpu[0].blocks_by_medium == {"CPU": 1} and cpu[0].kind == "full_attention"
    # The fixtures carry made-up hashes: not vLLM's default hashing.
    assert await harness.ingestor.hash_mode("single_group_ints") == "canonical"
    # Group 0 of an engine that sends no group info is full attention (the default kind).
    single = await harness.ingestor.worker_groups("single_group_ints")
    assert single[0].kind == "full_attention" and single[0].blocks_by_medium == {"GPU": 2}
    got = await harness.one([*range(48), 0], "single_group_ints")
    assert got.hit_tokens == 32


async def test_vllm_bare_lora_and_salt_extra_keys(harness: Harness) -> None:
    """vLLM puts the bare LoRA name and cache salt in the first block's extra keys."""
    await harness.ingestor.apply_batch("w", _fixture("events", "lora_salt_extra_keys"))
    toks = [*range(100, 116), 7]
    assert (await harness.one(toks, "w")).hit_tokens == 0
    assert (await harness.one(toks, "w", lora_name="sql-adapter")).hit_tokens == 0
    both = await harness.one(toks, "w", lora_name="sql-adapter", cache_salt="tenant-a")
    assert both.hit_tokens == 16


@pytest.mark.parametrize("form", ["int", "bytes"])
async def test_engine_hashing_detected_from_golden_vectors(harness: Harness, form: str) -> None:
    data = json.loads((FIXTURES / "hashes.json").read_text())
    for i, case in enumerate(data["cases"]):
        toks = data["token_sequences"][case["tokens"]]
        bs = case["block_size"]
        blocks = case["blocks"]
        hashes = [
            b["external_int"] if form == "int" else bytes.fromhex(b["digest_hex"]) for b in blocks
        ]
        salt = case["extra_keys_first_block"]
        extra = [(tuple(salt),)] + [None] * (len(blocks) - 1) if salt else None
        ev = BlockStored(
            hashes, None, toks[: len(blocks) * bs], bs, None, "GPU", None, extra_keys=extra
        )
        worker = f"w{i}"
        await harness.feed(worker, ev)
        assert await harness.ingestor.hash_mode(worker) == "engine", case
        got = await harness.one([*toks, 1], worker, cache_salt=salt[1] if salt else None)
        assert got.hit_tokens == len(blocks) * bs


async def test_learning_defaults_and_group_changes() -> None:
    h = Harness.build(make_index("memory"), default_kind="mla_attention", default_block_size=16)
    src = EventSource("foreign")
    toks = tokens(4 * 16 + 1)
    ev = src.store(toks, 16, 0, 4)
    await h.feed("w", ev)
    assert (await h.ingestor.worker_groups("w"))[0].kind == "mla_attention"
    zero = src.store(toks, 16, 0, 4)
    zero.block_size = 0  # an engine that leaves the size out: the configured default
    await h.feed("w", zero)
    assert h.ingestor.counters.bad_events == 0
    assert h.ingestor.counters.blocks_stored_repeat == 4
    # A larger block size in the group: keys stay chained at the hash unit (16), so the
    # group's blocks grow without a clear (the 32-token blocks end where 16-token blocks
    # already held end: copies); a new model behind a worker comes with a clear instead.
    await h.feed("w", src.store(toks, 32, 0, 2))
    assert h.ingestor.counters.group_changes == 1
    assert h.ingestor.counters.worker_clears == 0
    groups = await h.ingestor.worker_groups("w")
    assert groups[0].block_size == 32 and groups[0].blocks_by_medium == {"GPU": 4}
    assert (await h.one(toks, "w")).hit_tokens == 64


async def test_in_batch_chains_and_unknown_objects(harness: Harness) -> None:
    src = EventSource("foreign")
    toks = tokens(6 * 16 + 1)
    batch = wire(src.store(toks, 16, 0, 2), src.store(toks, 16, 2, 4), src.store(toks, 16, 4, 6))
    batch.events.append("not an event")  # type: ignore[arg-type]
    await harness.ingestor.apply_batch("w", batch)
    c = harness.ingestor.counters
    assert (c.unknown_parent, c.events_unknown, c.blocks_stored) == (0, 1, 6)
    assert (await harness.one(toks, "w")).hit_tokens == 96


async def test_multimodal_extra_keys_make_a_block_unmatchable(harness: Harness) -> None:
    src = EventSource("foreign")
    toks = tokens(4 * 16 + 1)
    ev = src.store(toks, 16, 0, 4)
    ev.extra_keys = [None, None, ("img-hash-1",), None]
    await harness.feed("w", ev)
    assert (await harness.one(toks, "w")).hit_tokens == 32  # stops before the image block


def test_split_extra_keys_forms() -> None:
    ours = split_extra_keys(
        [(("lora", "a", "/p"), ("cache_salt", "s")), (("lora", "a", "/p"),)], 2, None
    )
    assert (ours.lora_name, ours.cache_salt, ours.others) == ("a", "s", None)
    bare = split_extra_keys([("a", "s"), ("a",)], 2, "a")
    assert (bare.lora_name, bare.cache_salt, bare.others) == ("a", "s", None)
    mm = split_extra_keys([None, ("mm1", "mm2")], 2, None)
    assert mm.cache_salt is None and mm.others is not None and mm.others[0] is None


def test_request_keys_handle_any_token_value() -> None:
    big = [2**40, -5, 3, 2**63 - 1] * 8
    assert request_keys(big, 16) != request_keys([0] * 32, 16)
    assert len(request_keys(big, 16)) == 2
    assert request_keys(big, 16, cache_salt="x") != request_keys(big, 16)


async def test_clear_worker_resets_hash_mode_and_keeps_groups(harness: Harness) -> None:
    src = EventSource()
    toks = tokens(33)
    await harness.feed("w", src.store(toks, 16, 0, 2))
    await harness.ingestor.clear_worker("w")
    assert await harness.ingestor.hash_mode("w") == "unknown"
    assert list(await harness.ingestor.worker_groups("w")) == [0]
    state = await harness.index.load_worker("w")
    assert isinstance(state, WorkerState) and state.hash_mode == "unknown"
    assert harness.ingestor.counters.worker_clears == 1


def _pairs() -> list[tuple[str, list[BlockStored], list[int]]]:
    """Event pairs whose outcome once depended on sharing a batch (issue 14, item 3):
    the first pass resolved parents under the raw ``block_size``, the second under the
    learned or default one. (A size *below* the learned hash unit is different by design:
    it voids the keys chained so far, counted in ``hash_unit_changes``.)"""
    src = EventSource("foreign")
    toks = tokens(8 * 16 + 3, seed=5)
    zero = src.store(toks, 16, 2, 4)
    zero.block_size = 0  # size left out: the default (16) applies, in every pass
    return [
        ("parent then child", [src.store(toks, 16, 0, 2), src.store(toks, 16, 2, 4)], toks),
        ("child of a size-less store", [src.store(toks, 16, 0, 2), zero], toks),
        (
            "a larger size over the same tokens",
            [src.store(toks, 16, 0, 4), src.store(toks, 32, 0, 2)],
            toks,
        ),
        (
            "a partial entry then the block",
            [src.store(toks, 8, 0, 2), src.store(toks, 16, 0, 2)],
            toks,
        ),
    ]


@pytest.mark.parametrize("case", range(4))
async def test_one_batch_or_two_give_the_same_index(case: int) -> None:
    """One effective block size per event: the same events in one batch or in two
    batches leave the same entries and the same hits."""
    name, events, toks = _pairs()[case]
    one = Harness.build(make_index("memory"), default_block_size=16)
    two = Harness.build(make_index("memory"), default_block_size=16)
    await one.ingestor.apply_batch("w", KVEventBatch(1.0, list(events), 0))
    for ev in events:
        await two.ingestor.apply_batch("w", KVEventBatch(1.0, [ev], 0))
    assert await one.ingestor.worker_groups("w") == await two.ingestor.worker_groups("w"), name
    for n in range(1, len(toks) + 1, 7):
        assert (await one.one(toks[:n], "w")).hit_tokens == (
            await two.one(toks[:n], "w")
        ).hit_tokens, (name, n)
    assert one.ingestor.counters.unknown_parent == two.ingestor.counters.unknown_parent


async def test_bad_events_keep_being_logged(
    harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 14 item 10: not "logged once per process" -- each of the first few bad
    events of a kind is logged with the running count, then one line a minute."""
    caplog.set_level(logging.WARNING, logger="router.ingest.ingestor")
    src = EventSource("foreign")
    for i in range(3):
        ev = src.store(tokens(32, seed=i), 16, 0, 2, medium="NVMe-over-pigeon")
        await harness.feed("w", ev)
    lines = [r.getMessage() for r in caplog.records if "bad KV event" in r.getMessage()]
    assert len(lines) == 3 and "(3 bad events so far)" in lines[2], lines
