"""A store ingest rejects changes nothing (``router.ingest.rejects``): not the group's
kind or block size, not the groups a worker has, not the hash unit. Group indices and
block sizes are bounded, and bad events are logged once per kind of fault, never per
value, with the value cut short. Both backends; the fast path on and off where a batch
could take it."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from _helpers import FakeEngine, subscribe, wait_until
from _kv_streams import EventSource, Harness, cleared, configured_harness, tokens

from router.config import RouterSettings
from router.ingest import fast_path
from router.ingest.rejects import ECHO_CHARS, MAX_BLOCK_SIZE, MAX_GROUPS, group_ok
from router.service import RouterService
from schemas import BlockRemoved, BlockStored, KVEventBatch

BS = 16
HUGE = 2**40


@pytest.fixture(params=["memory", "redis"])
async def h(request: pytest.FixtureRequest) -> AsyncIterator[Harness]:
    harness = await configured_harness(request)
    yield harness
    await harness.index.close()


@pytest.fixture(params=[True, False], ids=["fast", "general"])
def fast(request: pytest.FixtureRequest) -> Iterator[bool]:
    was = fast_path.ENABLED
    fast_path.ENABLED = request.param
    yield request.param
    fast_path.ENABLED = was


def _store(
    hashes: list[int], toks: list[int], bs: int = BS, medium: str = "GPU", **kw: Any
) -> BlockStored:
    return BlockStored(hashes, None, toks, bs, None, medium, None, **kw)


# Stores the router rejects, each of which used to rewrite the worker's metadata.
BAD_STORES = {
    # "token_ids length does not fit": learned a 2**40-token block for group 0
    "huge_block": _store([5001, 5002, 5003], list(range(50_000, 50_048)), HUGE),
    # no blocks at all: not even counted, and the same 2**40-token block
    "empty_huge_block": _store([], [], HUGE),
    # a token-less copy (its tokens are not checked): taken, with its 2**40-token block
    "tokenless_huge_block": _store([101], [], HUGE),
    # 40 tokens for 3 blocks of 16: registered group 7 (learned: false for ever)
    "group_7": _store([5001, 5002, 5003], list(range(50_000, 50_040)), group_idx=7),
    # 16 tokens for a block of 17: the unit became gcd(16, 17) = 1, every entry wiped
    "block_17": _store([5001], list(range(50_000, 50_016)), 17),
    # just over the bound (a multiple of the unit): an offload copy, taken before
    "size_over_bound": _store([101], [], MAX_BLOCK_SIZE + BS, medium="CPU"),
}


async def _learned(h: Harness) -> tuple[Any, ...]:
    state = await h.index.load_worker("w")
    assert state is not None
    groups = {g: (m.kind, m.block_size, m.block_units) for g, m in state.groups.items()}
    return groups, state.hash_unit


@pytest.mark.parametrize("case", sorted(BAD_STORES))
async def test_a_rejected_store_changes_no_metadata(h: Harness, case: str) -> None:
    src = EventSource("foreign")
    old, new = tokens(4 * BS + 1, seed=1), tokens(4 * BS + 1, seed=2)
    await h.feed("w", src.store(old, BS, 0, 4))
    assert (await h.one(old, "w")).hit_tokens == 64
    before = await _learned(h)
    c = h.ingestor.counters
    # The bad store and a new chain in one batch: the chain is not planned against it.
    await h.feed("w", BAD_STORES[case], src.store(new, BS, 0, 4))
    assert c.bad_events == 1, case  # counted, the empty store too
    assert await _learned(h) == before
    assert (c.worker_clears, c.hash_unit_changes, c.group_changes) == (0, 0, 0)
    for toks in (old, new):
        row = await h.one(toks, "w")
        assert (row.hit_tokens, row.learned) == (64, True), case
    # What the audit saw "for ever": after an engine reset a new chain still scores.
    again = tokens(4 * BS + 1, seed=3)
    await h.feed("w", cleared())
    await h.feed("w", src.store(again, BS, 0, 4))
    row = await h.one(again, "w")
    assert (row.hit_tokens, row.learned) == (64, True), case
    assert await _learned(h) == before


@pytest.mark.parametrize("group", [MAX_GROUPS, 100_000, 2**64 - 1])
async def test_a_group_index_beyond_the_bound_is_rejected(
    h: Harness, fast: bool, group: int
) -> None:
    """A valid store in every other respect, on a worker whose next batch the fast path
    takes: rejected and counted as a bad group, so no score works per group up to it."""
    src = EventSource("foreign")
    toks = tokens(4 * BS + 1)
    await h.feed("w", src.store(toks, BS, 0, 4))
    before = await _learned(h)
    c = h.ingestor.counters
    wild = _store([4242], toks[:BS], group_idx=group)
    await h.feed("w", wild, BlockRemoved([4242], "GPU", group))
    assert (c.bad_events, c.bad_groups) == (2, 2)
    assert await _learned(h) == before
    assert list(await h.ingestor.worker_groups("w")) == [0]
    row = await h.one(toks, "w")
    assert (row.hit_tokens, row.learned, len(row.groups)) == (64, True, 1)


def test_the_bounds() -> None:
    assert group_ok(None) and group_ok(0) and group_ok(MAX_GROUPS - 1)
    assert not any(group_ok(g) for g in (-1, MAX_GROUPS, 2**64 - 1, True, "0", 1.0))


async def test_bad_events_are_logged_per_kind_of_fault(
    h: Harness, fast: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """1000 distinct bad values used to be 1000 log lines, and a 4 MiB medium name a
    4 MiB line: now the first 5 per kind of fault, each value cut short."""
    caplog.set_level(logging.WARNING, logger="router.ingest.ingestor")
    src = EventSource("foreign")
    toks = tokens(4 * BS + 1)
    await h.feed("w", src.store(toks, BS, 0, 4))  # known hash mode: the fast path's turn
    n = 40
    for i in range(n):
        await h.feed("w", _store([10**6 + i], list(range(BS)), -(i + 1)))
    for i in range(n):
        await h.feed("w", BlockRemoved([1], f"M{i}"))
    await h.feed("w", BlockRemoved([1], "X" * (4 << 20)))
    assert h.ingestor.counters.bad_events == 2 * n + 1
    lines = [r.getMessage() for r in caplog.records if "bad KV event" in r.getMessage()]
    assert len(lines) == 10, lines  # 5 invalid block sizes, 5 unknown media
    assert sum("invalid block_size -" in line for line in lines) == 5
    assert sum("unknown medium 'M" in line for line in lines) == 5
    assert max(map(len, lines)) < 2 * ECHO_CHARS
    assert (await h.one(toks, "w")).hit_tokens == 64


@pytest.fixture(params=["memory", "redis"])
def settings(request: pytest.FixtureRequest) -> RouterSettings:
    if request.param == "memory":
        return RouterSettings(replay_timeout_s=1.0)
    url = request.getfixturevalue("redis_url")
    return RouterSettings(index="redis", redis_url=url, replay_timeout_s=1.0)


async def test_bad_stores_over_zmq_leave_the_worker_scoring(
    engine: FakeEngine, settings: RouterSettings
) -> None:
    """The audit's stream through a real publisher socket and the router service: a good
    chain, the rejected 2**40-token store, a store in group 2**64 - 1, a reset, a new
    chain: the new chain scores in full and the worker stays learned."""
    svc = RouterService(settings)
    await svc.start()
    try:
        sub = await subscribe(svc, engine, synced=True)
        src = EventSource("foreign")
        old, new = tokens(4 * BS + 1, seed=1), tokens(4 * BS + 1, seed=2)
        stream = [
            [src.store(old, BS, 0, 4)],
            [BAD_STORES["huge_block"], BAD_STORES["empty_huge_block"]],
            [_store([4242], old[:BS], group_idx=2**64 - 1)],
            [cleared()],
            [src.store(new, BS, 0, 4)],
        ]
        for events in stream:
            seq = await engine.publish(KVEventBatch(0.0, events, 0))
        await wait_until(lambda: sub.last_seq.get(0, -1) >= seq, what="stream applied")
        c = svc.ingestor.counters
        assert (c.bad_events, c.bad_groups) == (3, 1)
        row = (await svc.score(new, ["w0"])).workers[0]
        assert (row.hit_tokens, row.learned) == (64, True)
        groups = await svc.ingestor.worker_groups("w0")
        assert {g: i.block_size for g, i in groups.items()} == {0: BS}
    finally:
        await svc.stop()
