"""Router replicas on a Redis that lost its content score from what it holds now.

Each replica caches the workers' metadata and slots by the shard's version
(``router.index.redis_meta``); a score sends that version and gets no metadata back
while the server's is the same. The version used to be an INCR counter, so a Redis
flushed (or restarted without persistence) counted again from 0: once as many metadata
changes had happened as before the loss, every replica's stale cache was "current"
again, with the slots swapped where the workers came back in another order -- every
score went to the wrong worker, for good. A version must never come back.

Real redis-server (and valkey-server where installed), two real ``RouterService``
replicas, two real publishers over ZMQ. The replicas' own repair (the index watch) runs
when the test calls it rather than on its timer, so the workers surely come back in the
other order; the version is then driven up to the one the replicas cached (what any
number of later registrations or setting changes does), and both must score exactly.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import AsyncIterator, Iterator

import pytest
import redis
from _helpers import FakeEngine, batch, chain, store_chain, wait_until
from _kv_streams import Harness
from _redis import start_redis_server

from router.config import RouterSettings, WorkerSpec
from router.index import redis_lua
from router.index.redis import RedisIndex
from router.index.redis_codec import index_prefix
from router.netutil import free_port
from router.service import RouterService

X = index_prefix(0)
# chain -> the worker that holds it: w1 and w2 each before the loss, w2 first after it.
HOLDER = {1: "w1", 2: "w2", 3: "w2", 4: "w1"}


def serve(binary: str, port: int) -> subprocess.Popen[bytes]:
    """A redis-server (or valkey-server) without persistence on ``port``, answering."""
    return start_redis_server(binary, port).proc


@pytest.fixture
async def engines() -> AsyncIterator[dict[str, FakeEngine]]:
    made = {"w1": FakeEngine(), "w2": FakeEngine()}
    yield made
    for e in made.values():
        await e.close()


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for p in started:
        p.kill()
        p.wait(timeout=10)


async def scores(svc: RouterService, i: int) -> dict[str, int]:
    resp = await svc.score([*chain(i)[1], 7], ["w1", "w2"])
    return {w.worker_id: w.hit_tokens for w in resp.workers}


def truth(i: int) -> dict[str, int]:
    return {w: 8 if HOLDER[i] == w else 0 for w in ("w1", "w2")}


async def publish(
    engine: FakeEngine, i: int, replicas: list[RouterService], worker: str, client: redis.Redis
) -> None:
    """Chain ``i`` on ``worker``'s publisher, applied by both replicas (its slot taken)."""
    seq = await engine.publish(batch(store_chain(i)))
    for svc in replicas:
        sub = svc.subscriptions.get(worker)
        assert sub is not None
        await wait_until(lambda s=sub: s.last_seq.get(0) == seq, what=f"{worker} seq {seq}")
    assert client.hget(X + "slot", worker) is not None


@pytest.mark.parametrize(
    ("binary", "loss"),
    [("redis-server", "flushall"), ("redis-server", "restart"), ("valkey-server", "flushall")],
)
async def test_replicas_score_right_after_the_index_lost_its_content(
    binary: str,
    loss: str,
    engines: dict[str, FakeEngine],
    procs: list[subprocess.Popen[bytes]],
) -> None:
    if binary != "redis-server" and shutil.which(binary) is None:
        pytest.skip(f"{binary} not installed (the redis-server cases cover the same code)")
    port = free_port()
    procs.append(serve(binary, port))
    url = f"redis://127.0.0.1:{port}/0"
    client = redis.Redis(port=port, socket_timeout=5)
    specs = [WorkerSpec(**engines[w].spec(w)) for w in ("w1", "w2")]
    # The watch's timer never fires here: the test runs each replica's check itself.
    settings = RouterSettings(
        index="redis",
        redis_url=url,
        workers=specs,
        replay_timeout_s=2,
        index_check_s=3600,
        ingest_retry_max_s=0.2,
    )
    replicas = [RouterService(settings), RouterService(settings)]
    admin = RedisIndex(url)
    fresh = Harness.build(RedisIndex(url))
    try:
        for svc in replicas:
            await svc.start()
        for e in engines.values():
            await e.wait_subscribed(2)
        await publish(engines["w1"], 1, replicas, "w1", client)  # w1: slot 0
        await publish(engines["w2"], 2, replicas, "w2", client)  # w2: slot 1
        state = await admin.load_worker("w1")
        assert state is not None
        for _ in range(20):  # more metadata changes before the loss than after it
            await admin.save_worker("w1", state)
        for svc in replicas:  # both cache the metadata at this version
            assert [await scores(svc, i) for i in (1, 2)] == [truth(1), truth(2)]
        cached = int(client.get(X + "ver") or 0)

        if loss == "flushall":
            client.flushall()
        else:  # killed, started again empty on the same port
            procs[0].kill()
            procs[0].wait(timeout=10)
            procs[0] = serve(binary, port)
            client = redis.Redis(port=port, socket_timeout=5)
        # New traffic reaches w2 first: the slots come back swapped (w2: 0, w1: 1).
        await publish(engines["w2"], 3, replicas, "w2", client)
        await publish(engines["w1"], 4, replicas, "w1", client)
        assert [client.hget(X + "slot", w) for w in ("w1", "w2")] == [b"1", b"0"]
        # The replicas' watches: the first to look repairs (the other finds the workers).
        noticed = [await svc.index_watch.check() for svc in replicas if svc.index_watch]
        assert noticed == [True, False]

        async def rebuilt() -> bool:
            if any(sub.syncing for svc in replicas for sub in svc.subscriptions.all()):
                return False
            got = [await fresh.score([*chain(i)[1], 7], ["w1", "w2"]) for i in HOLDER]
            return all(
                {w.worker_id: w.hit_tokens for w in r.workers} == truth(i)
                for i, r in zip(HOLDER, got, strict=True)
            )

        await wait_until(rebuilt, what="the index rebuilt from the publishers", timeout=30)
        # More metadata changes (registrations, settings): the version moves on. It must
        # never reach the one the replicas cached before the loss.
        while int(client.get(X + "ver") or 0) < cached:
            await admin.save_worker("w1", state)
        for svc in replicas:
            assert {i: await scores(svc, i) for i in HOLDER} == {i: truth(i) for i in HOLDER}
        assert int(client.get(X + "ver") or 0) > cached
    finally:
        for svc in replicas:
            await svc.stop()
        await admin.close()
        await fresh.index.close()


async def test_every_bump_moves_the_version_to_the_clock_at_least(redis_url: str) -> None:
    """Each place that moves a shard's version (a worker's metadata saved, a slot handed
    out, a worker removed, its slot freed) leaves it at the server's clock or above: a
    version left small (as after a loss) never counts up through cached ones."""
    client = redis.Redis.from_url(redis_url)
    h = Harness.build(RedisIndex(redis_url))
    index = h.index
    assert isinstance(index, RedisIndex)

    def small_then_clock() -> int:
        client.set(X + "ver", 5)
        sec, usec = client.time()
        return int(sec) * 1_000_000 + int(usec)

    def version() -> int:
        return int(client.get(X + "ver") or 0)

    try:
        now = small_then_clock()
        await h.feed("w1", store_chain(1))  # metadata saved, a slot handed out
        assert version() >= now
        state = await index.load_worker("w1")
        assert state is not None
        now = small_then_clock()
        await index.save_worker("w1", state)
        assert version() >= now
        now = small_then_clock()
        await h.feed("w2", store_chain(2))
        assert version() >= now
        now = small_then_clock()
        client.eval(redis_lua.FREE, 1, X + "slot", X, "w2")  # the slot of a removed worker
        assert version() >= now
        now = small_then_clock()
        await index.remove_worker("w1")
        assert version() >= now
        before = version()
        await index.save_worker("w2", state)  # while the key lives: + 1 at least
        assert version() > before
    finally:
        await index.close()
