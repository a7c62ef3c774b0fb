"""The Redis index on Valkey (the Redis fork, 8.x): the core contract against a real
``valkey-server`` on loopback -- ingest, scores equal to the in-process index fed the
same events, a second router replica answering alike, removals, a clear and a removed
worker. Skipped (with the reason) where ``valkey-server`` is not installed; ``make
system-deps`` installs it from Debian bookworm-backports where it can."""

from __future__ import annotations

import pytest
import redis
from _kv_streams import EventSource, Harness, cleared, feed_hybrid_fleet, wire

from router.index import make_index
from router.index.redis import StaleMappings

N_WORKERS = 10
BS = 16
SWA = {"kind": "sliding_window", "window": 48}


async def test_valkey_two_replicas_answer_like_the_memory_index(valkey_server: object) -> None:
    url = valkey_server.url  # type: ignore[attr-defined]
    client = redis.Redis.from_url(url)
    client.flushall()
    assert "valkey_version" in client.info("server")  # really Valkey, not Redis
    a = Harness.build(make_index("redis", url))
    b = Harness.build(make_index("redis", url))
    ref = Harness.build(make_index("memory"))
    workers = [f"w{w}" for w in range(N_WORKERS)]
    asked = [*workers, "unknown"]
    try:
        # replica a ingests; b only reads
        prompts = await feed_hybrid_fleet([a, ref], n_workers=N_WORKERS, seed=3)
        assert sorted(await b.index.known_workers()) == workers
        hits = 0
        for toks in prompts:
            want = await ref.scorer.score_result(toks, asked)
            assert await a.scorer.score_result(toks, asked) == want
            assert await b.scorer.score_result(toks, asked) == want
            hits += sum(1 for r in want.workers if r.hit_tokens)
        assert hits >= N_WORKERS  # the comparison was about real hits
        # A clear through replica b voids a's cached mappings of w1: a's next write to w1
        # is refused whole (StaleMappings), and the writer's retry applies it.
        for h in (b, ref):
            await h.feed("w1", cleared())
        src = EventSource("engine")
        batch = wire(
            src.store(prompts[1], BS, 0, 5, group=0, kind="full_attention"),
            src.store(prompts[1], BS, 0, 5, group=1, **SWA),
        )
        with pytest.raises(StaleMappings):
            await a.ingestor.apply_batch("w1", batch)
        for h in (a, ref):
            await h.ingestor.apply_batch("w1", batch)
        for toks in prompts:
            want = await ref.scorer.score_result(toks, asked)
            assert await a.scorer.score_result(toks, asked) == want
            assert await b.scorer.score_result(toks, asked) == want
        assert (await b.one(prompts[1], "w1")).hit_tokens == 5 * BS
        stats = await b.index.stats()
        assert stats["workers"] == N_WORKERS and int(stats["entries"]) > 0
        await a.index.remove_worker("w0")
        assert (await b.scorer.score_result(prompts[0], ["w0"])).workers[0].learned is False
    finally:
        for h in (a, b, ref):
            await h.index.close()
        client.close()
