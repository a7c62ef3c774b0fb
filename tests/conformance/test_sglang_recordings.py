"""Replay of SGLang 0.5.23's own radix cache: every probe exact, no event rejected.

``tests/fixtures/sglang-0.5/*.msgpack`` were recorded by ``make conformance-sglang``
(``conformance/sglang/sglang_record.py``): SGLang's ``RadixCache`` served multi-turn,
salted / LoRA, evicting workloads (one scenario with a host tier), its batches went out
through SGLang's ``ZmqEventPublisher`` and came back from its replay socket, and before
every step ``match_prefix`` (capped at ``len - 1`` tokens, as the scheduler does) answered
each probe. Here the frames go through kvroute's decoder and ingestor into the memory and
the Redis index, and the scorer must give SGLang's answer for every probe.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
import redis

from router.index import make_index
from router.ingest.ingestor import Ingestor
from router.ingest.sglang_keys import event_hash, page_digests, salt_seed
from router.netutil import free_port
from router.score.scorer import Scorer
from schemas import BlockStored, DecodeStats, decode_batch

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "sglang-0.5"
SCENARIOS = ("page1", "page16", "salted", "host")
WORKER = "sglang-0"


def _load(name: str) -> dict[str, Any]:
    return msgspec.msgpack.decode((FIXTURES / f"{name}.msgpack").read_bytes())


@pytest.fixture(scope="module")
def sglang_redis_url() -> Iterator[str]:
    """A private redis-server on a free loopback port for this module."""
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.fail("redis-server not found on PATH (run `make system-deps`)", pytrace=False)
    port = free_port()
    proc = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    client = redis.Redis(host="127.0.0.1", port=port, socket_timeout=5)
    deadline = time.monotonic() + 15
    while True:
        try:
            client.ping()
            break
        except redis.exceptions.ConnectionError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                pytest.fail("redis-server did not start", pytrace=False)
            time.sleep(0.02)
    yield f"redis://127.0.0.1:{port}/0"
    client.flushall()
    proc.kill()
    proc.wait(timeout=10)


def test_fixtures_are_sglangs_recordings() -> None:
    for name in SCENARIOS:
        rec = _load(name)
        assert rec["sglang_version"] == "0.5.23"
        assert rec["frames"] and rec["probes"]
        seqs = [int.from_bytes(seq, "big") for _, seq, _ in rec["frames"]]
        assert seqs == list(range(len(seqs)))


@pytest.mark.parametrize("kind", ["memory", "redis"])
@pytest.mark.parametrize("name", SCENARIOS)
async def test_every_probe_matches_sglang(
    name: str, kind: str, request: pytest.FixtureRequest
) -> None:
    rec = _load(name)
    url = request.getfixturevalue("sglang_redis_url") if kind == "redis" else None
    index = make_index(kind, url)
    ingestor, scorer = Ingestor(index), Scorer(index)
    stats = DecodeStats()
    frames = rec["frames"]
    fed = 0
    exact = 0
    misses: list[tuple[int, int, int, int, int]] = []
    try:
        if kind == "redis":  # one server for every scenario: a fresh worker each time
            await index.remove_worker(WORKER)
        for i, probe in enumerate(rec["probes"]):
            while fed < probe["after_batches"]:
                await ingestor.apply_batch(WORKER, decode_batch(frames[fed][2], stats))
                fed += 1
            res = await scorer.score(
                probe["token_ids"],
                [WORKER],
                cache_salt=probe["cache_salt"],
                lora_name=probe["lora_name"],
            )
            w = res.workers[0]
            got = (w.hit_tokens, w.hit_tokens_gpu)
            want = (probe["hit_tokens"], probe["hit_tokens_gpu"])
            if got == want:
                exact += 1
            else:
                misses.append((i, *got, *want))
        c = ingestor.counters
        assert misses == [], f"{name}/{kind}: {exact}/{len(rec['probes'])} exact; {misses[:5]}"
        assert stats.slow_path_batches == stats.malformed_events == stats.unknown_fields == 0
        assert c.bad_events == c.unknown_parent == c.unresolved_blocks == 0
        assert await ingestor.hash_mode(WORKER) == "engine"
    finally:
        await index.close()


@pytest.mark.parametrize("name", SCENARIOS)
def test_router_computes_sglangs_own_block_hashes(name: str) -> None:
    """Every stored block's wire hash is SGLang's chain over its tokens (salt seeded);
    LoRA chains are namespaced by the adapter's internal id, which the router never sees."""
    rec = _load(name)
    digests: dict[int, bytes] = {}
    checked = 0
    for _, _, payload in rec["frames"]:
        for ev in decode_batch(payload).events:
            if not isinstance(ev, BlockStored) or ev.lora_name is not None:
                continue
            if ev.parent_block_hash is None:
                prior = salt_seed(ev.cache_salt)
            else:
                prior = digests[ev.parent_block_hash]
            chain = page_digests(ev.token_ids, ev.block_size, prior)
            assert [event_hash(d) for d in chain] == ev.block_hashes
            digests.update(zip(ev.block_hashes, chain, strict=True))
            checked += len(chain)
    assert checked > 0
