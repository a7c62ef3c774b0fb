"""Memory and Redis give identical scores on one random stream, and both equal a
reference model (the hit rule applied to what the stream says each worker holds)."""

from __future__ import annotations

import random
from collections import defaultdict

import pytest
from _kv_streams import EventSource, Harness, cleared, new_index, tokens

from router.index import IndexUnavailable
from schemas.hit_rule import GroupSpec, longest_hit

# Mixed block sizes: the hit step is lcm(16, 32) = 32.
GROUPS = {
    0: GroupSpec("full_attention", 16),
    1: GroupSpec("sliding_window", 16, 48),
    2: GroupSpec("mamba", 32),
}
MEDIA = ("GPU", "CPU")


class Reference:
    """What each (worker, group) holds, as a set of (block index, prompt, medium)."""

    def __init__(self) -> None:
        self.held: dict[tuple[str, int], dict[tuple[int, ...], set[str]]] = defaultdict(dict)
        self.learned: dict[str, set[int]] = defaultdict(set)  # groups announced by stores

    def holds(self, w: str, g: int, prefix: tuple[int, ...]) -> set[str]:
        return self.held[(w, g)].get(prefix, set())

    def parent_known(self, w: str, bs: int, prefix: tuple[int, ...]) -> bool:
        return any(
            self.held[(w, g)].get(prefix) for g, spec in GROUPS.items() if spec.block_size == bs
        )

    def hit(self, w: str, toks: list[int], media: tuple[str, ...]) -> int:
        learned = self.learned[w]
        if not learned or learned != set(range(max(learned) + 1)):
            return 0  # a group below a learned one is unknown: the router does not guess
        cached = []
        specs = [GROUPS[g] for g in sorted(learned)]
        for g, spec in sorted(GROUPS.items()):
            if g not in learned:
                continue
            bs = spec.block_size
            n = len(toks) // bs
            cached.append(
                [bool(self.holds(w, g, tuple(toks[: (i + 1) * bs])) & set(media)) for i in range(n)]
            )
        return longest_hit(len(toks), specs, cached)


async def _drive(harnesses: list[Harness], seed: int) -> int:
    rng = random.Random(seed)
    prompts = [tokens(16 * 16 + 7, seed=s) for s in range(4)]
    prompts.append(prompts[0][:96] + tokens(160, seed=99))  # shares a prefix with prompt 0
    workers = ["w0", "w1", "w2"]
    sources = {"w0": EventSource("engine"), "w1": EventSource("foreign", seed=1)}
    sources["w2"] = EventSource("engine", algo="sha256_cbor")
    ref = Reference()
    nonzero = 0
    for _step in range(300):
        w = rng.choice(workers)
        src = sources[w]
        g = rng.choice(list(GROUPS))
        spec = GROUPS[g]
        bs = spec.block_size
        toks = rng.choice(prompts)
        n = len(toks) // bs
        medium = rng.choice(MEDIA)
        roll = rng.random()
        if roll < 0.55:
            start = rng.choice([0, 0, rng.randrange(n)])
            stop = rng.randint(start + 1, n)
            parent = tuple(toks[: start * bs])
            if start and not ref.parent_known(w, bs, parent):
                continue  # the router would count it as unknown_parent (tested elsewhere)
            ev = src.store(
                toks,
                bs,
                start,
                stop,
                group=g,
                kind=spec.kind,
                window=spec.sliding_window,
                medium=medium,
            )
            ref.learned[w].add(g)
            for i in range(start, stop):
                ref.held[(w, g)].setdefault(tuple(toks[: (i + 1) * bs]), set()).add(medium)
        elif roll < 0.95:
            idx = rng.sample(range(n), rng.randint(1, 4))
            ev = src.remove(toks, bs, idx, group=g, medium=medium)
            for i in idx:
                prefix = tuple(toks[: (i + 1) * bs])
                media = ref.held[(w, g)].get(prefix)
                if media is not None:
                    media.discard(medium)
                    if not media:
                        del ref.held[(w, g)][prefix]
        else:
            ev = cleared()
            for key in [k for k in ref.held if k[0] == w]:
                ref.held[key].clear()
        for h in harnesses:
            await h.feed(w, ev)
        if _step % 10 == 9:
            for toks in prompts:
                answers = [await h.score(toks, workers) for h in harnesses]
                assert all(a == answers[0] for a in answers[1:])
                for ws in answers[0].workers:
                    assert ws.hit_tokens == ref.hit(ws.worker_id, toks, MEDIA)
                    assert ws.hit_tokens_gpu == ref.hit(ws.worker_id, toks, ("GPU",))
                    nonzero += ws.hit_tokens > ws.hit_tokens_gpu > 0
    return nonzero


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_memory_and_redis_agree_with_the_reference(redis_url: str, seed: int) -> None:
    harnesses = [Harness.build(new_index(k, redis_url)) for k in ("memory", "redis")]
    try:
        assert await _drive(harnesses, seed) > 0  # offloaded-only hits did occur
        stats = [await h.index.stats() for h in harnesses]
        assert stats[0]["entries"] == stats[1]["entries"]
        assert stats[0]["map_entries"] == stats[1]["map_entries"]
        assert harnesses[0].ingestor.counters == harnesses[1].ingestor.counters
    finally:
        for h in harnesses:
            await h.index.close()


async def test_redis_down_raises_index_unavailable(redis_factory) -> None:  # type: ignore[no-untyped-def]
    server = redis_factory()
    h = Harness.build(new_index("redis", server.url))
    src = EventSource()
    toks = tokens(64 + 1)
    try:
        await h.feed("w", src.store(toks, 16, 0, 4))
        assert await h.index.ping()
        server.stop()
        assert not await h.index.ping()
        with pytest.raises(IndexUnavailable):
            await h.score(toks, ["w"])
        with pytest.raises(IndexUnavailable):
            await h.feed("w", src.remove(toks, 16, [0]))
        with pytest.raises(IndexUnavailable):
            await h.index.stats()
        with pytest.raises(IndexUnavailable):
            await h.ingestor.worker_groups("w")
    finally:
        await h.index.close()


async def test_redis_survives_a_script_flush(redis_url: str, redis_server) -> None:  # type: ignore[no-untyped-def]
    """Scripts vanish on a Redis restart or SCRIPT FLUSH; both paths load them again."""
    h = Harness.build(new_index("redis", redis_url))
    src = EventSource()
    toks = tokens(4 * 16 + 1)
    try:
        await h.feed("w", src.store(toks, 16, 0, 2))
        assert (await h.one(toks, "w")).hit_tokens == 32
        redis_server.client().script_flush()
        await h.feed("w", src.store(toks, 16, 2, 4))
        redis_server.client().script_flush()
        assert (await h.one(toks, "w")).hit_tokens == 64
    finally:
        await h.index.close()
