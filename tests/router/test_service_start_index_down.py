"""A router started while its Redis index does not answer yet (docs/security.md, "Loud
mistakes"; docs/reliability.md): the start-up is only a warning, ``/readyz`` and
``/v1/score`` answer 503, and once Redis answers the start-up workers are set up in it
and what their engine published meanwhile is indexed.

Real redis-server (started on the router's port only after the router), real ZMQ
(``FakeEngine``), real HTTP (``serve_app``).
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from _helpers import FakeEngine, batch, chain, hits, serve_app, store_chain, wait_until

from publisher import ZmqEventPublisher
from router.config import RouterSettings, WorkerSpec
from router.http import create_app
from router.netutil import free_port
from router.service import RouterService


@pytest.fixture
async def engine() -> AsyncIterator[FakeEngine]:
    eng = FakeEngine()
    yield eng
    await eng.close()


@pytest.fixture
def later_redis() -> Iterator[tuple[str, Any]]:
    """A Redis URL on a free port where nothing listens yet, and ``start()`` to start a
    redis-server there (killed at the end)."""
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.fail("redis-server not found on PATH: the router tests need a real Redis")
    port = free_port()
    procs: list[subprocess.Popen[bytes]] = []

    def start() -> None:
        argv = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", ""]
        procs.append(
            subprocess.Popen(
                [*argv, "--appendonly", "no"],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )

    yield f"redis://127.0.0.1:{port}/0", start
    for proc in procs:
        proc.kill()
        proc.wait(timeout=10)


async def test_router_starts_while_redis_is_down_and_sets_workers_up_once_it_answers(
    engine: FakeEngine, later_redis: tuple[str, Any]
) -> None:
    url, start_redis = later_redis
    spec = WorkerSpec(**engine.spec("w0", hash_block_size=4))
    settings = RouterSettings(
        index="redis",
        redis_url=url,
        workers=[spec],
        replay_timeout_s=1.0,
        ingest_retry_max_s=0.2,
        index_check_s=0.2,
    )
    app = create_app(settings=settings)
    svc = app.state.service
    async with serve_app(app) as c:  # used to fail: IndexUnavailable at start-up
        await engine.wait_subscribed()  # the worker's subscription is open
        await engine.publish(batch(store_chain(0)))  # published during the outage
        r = await c.get("/readyz")
        assert r.status_code == 503 and r.json()["error"]["code"] == "index_unavailable", r.text
        body = {"token_ids": [*chain(0)[1], 7]}
        r = await c.post("/v1/score", json=body)
        assert r.status_code == 503 and r.json()["error"]["code"] == "index_unavailable", r.text
        r = await c.get("/v1/workers/w0")
        assert r.status_code == 200, r.text  # registered, the transport side reported

        start_redis()

        async def ready() -> bool:
            return (await c.get("/readyz")).status_code == 200

        await wait_until(ready, what="/readyz once Redis answers")
        # The worker's settings were saved in the index at set-up.
        state = await svc.index.load_worker("w0")
        assert state is not None and state.settings.hash_block_size == 4
        assert state.hash_unit == 4
        await engine.publish(batch(store_chain(1)))  # published after the outage

        async def both_indexed() -> list[int] | None:
            got = []
            for i in range(2):
                r = await c.post("/v1/score", json={"token_ids": [*chain(i)[1], 7]})
                if r.status_code != 200:
                    return None
                got.append(r.json()["workers"][0]["hit_tokens"])
            return got if got == [8, 8] else None

        await wait_until(both_indexed, what="both chains scored from the Redis index")
        assert await svc.index.known_workers() == ["w0"]
        info = (await c.get("/v1/workers/w0")).json()
        assert info["last_seq"] == {"0": 1}, info
        # The set-up was not mistaken for an index that lost its content.
        assert svc.index_watch is not None and svc.index_watch.losses == 0


async def test_the_shared_listener_survives_an_index_down_at_start_up(
    later_redis: tuple[str, Any],
) -> None:
    """``--listen``: a new topic's worker cannot be registered while the index does not
    answer. That used to end the listener's task (every engine it feeds went unheard for
    good); now the frame is dropped and the worker is adopted once the index answers."""
    url, start_redis = later_redis
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    settings = RouterSettings(index="redis", redis_url=url, listen=endpoint, ingest_retry_max_s=0.2)
    svc = RouterService(settings)
    await svc.start()
    pub = ZmqEventPublisher(endpoint, topic="kv@eng1")  # connects, like vLLM
    try:
        listener = svc.listener
        assert listener is not None
        assert not await svc.ready()

        def refused_twice() -> bool:
            pub.publish(batch(store_chain(0)))
            return listener.unknown_topics >= 2  # the second frame: the listener lives on

        await wait_until(refused_twice, what="frames of a new topic during the outage")
        assert svc.worker_ids() == []
        start_redis()
        await wait_until(svc.ready, what="ready once Redis answers")

        async def adopted_and_indexed() -> bool:
            pub.publish(batch(store_chain(1)))
            return "eng1" in svc.worker_ids() and await hits(svc, "eng1", 1) == 8

        await wait_until(adopted_and_indexed, what="the worker adopted and its stores indexed")
    finally:
        pub.shutdown()
        await svc.stop()


async def test_stop_ends_a_task_that_swallowed_its_cancellation() -> None:
    """What redis-py did to the listener above: a cancellation that lands as a command
    completes is lost, and the task goes on to wait for its next frame. ``stop()`` used
    to wait for it forever."""
    svc = RouterService(RouterSettings())
    waiting, swallowed = asyncio.Event(), asyncio.Event()

    async def stubborn() -> None:
        waiting.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            swallowed.set()  # lost, as in a library finishing its call
        await asyncio.Event().wait()  # the next input that never comes

    svc.add_background(stubborn)
    await svc.start()
    await waiting.wait()
    # Not wait_for: stop() suppresses a cancellation itself, so wait_for's would return.
    stopping = asyncio.create_task(svc.stop())
    done, _ = await asyncio.wait({stopping}, timeout=10)
    if not done:
        stopping.cancel()
        for task in svc._tasks:
            task.cancel()
    assert done, "stop() waits for ever for a task that swallowed its cancellation"
    assert swallowed.is_set()
