"""Failover through the proxy: an engine killed mid-run, a worker that never connected,
a fleet with nobody left, an engine killed mid-stream - real ``kvroute engine`` and
``kvroute serve`` processes."""

from __future__ import annotations

import threading
from pathlib import Path

import httpx
import openai
import pytest
from _fleet import MODEL, fleet, poll, shutdown, start_engines, start_router, stop, wait_live

from router.netutil import free_ports

pytestmark = pytest.mark.timeout(300)


def test_killed_engine_fails_over_and_a_never_connected_worker_gets_nothing(
    tmp_path: Path,
) -> None:
    engines = start_engines(tmp_path, 2)
    pub, replay, http = free_ports(3)  # nothing listens on these: a mistyped worker
    ghost = (
        f"ghost=tcp://127.0.0.1:{pub},replay=tcp://127.0.0.1:{replay},http=http://127.0.0.1:{http}"
    )
    router = start_router(tmp_path, [e.spec() for e in engines] + [ghost])
    router.engines = engines
    try:
        wait_live(router, [e.worker_id for e in engines])
        ghost_info = router.workers()["ghost"]
        assert not ghost_info["live"] and "never connected" in ghost_info["why_not_live"]

        client = openai.OpenAI(base_url=f"{router.url}/v1", api_key="-", max_retries=0, timeout=30)
        results: list[str] = []
        errors: list[BaseException] = []
        killed = threading.Event()

        def worker(k: int) -> None:
            for i in range(15):
                if k == 0 and i == 5:
                    victim = engines[0]
                    stop(victim.proc, kill=True)
                    killed.set()
                try:
                    r = client.completions.with_raw_response.create(
                        model=MODEL, prompt=f"kabe {k} dodo {i % 4} " * 20, max_tokens=2
                    )
                    results.append(r.headers["x-kvroute-worker"])
                except BaseException as exc:
                    errors.append(exc)

        threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not any(t.is_alive() for t in threads), "a request hung"
        assert killed.is_set()
        assert errors == [] and len(results) == 60
        assert "ghost" not in results
        poll(lambda: not router.workers()[engines[0].worker_id]["live"], "killed engine out")
        why = router.workers()[engines[0].worker_id]["why_not_live"]
        assert why and ("disconnected" in why or "failed" in why or "answered" in why)

        # Nobody left: a clear 503 naming each worker's reason, no hang.
        stop(engines[1].proc, kill=True)
        poll(lambda: not router.live(), "no live workers")
        r = httpx.post(
            f"{router.url}/v1/completions", json={"model": MODEL, "prompt": "kabe"}, timeout=30
        )
        assert r.status_code == 503 and r.json()["error"]["code"] == "no_live_workers"
        assert "ghost" in r.json()["error"]["message"]
    finally:
        shutdown(router)


def test_engine_killed_mid_stream_ends_the_stream_with_an_error_not_a_hang(
    tmp_path: Path,
) -> None:
    router = fleet(tmp_path, 1, "--token-delay-ms", "20")
    try:
        client = openai.OpenAI(base_url=f"{router.url}/v1", api_key="-", max_retries=0, timeout=30)
        stream = client.completions.create(
            model=MODEL, prompt="hali " * 20, max_tokens=3000, stream=True
        )
        got = 0
        with pytest.raises(openai.APIError, match="stream broken"):
            for _ in stream:
                got += 1
                if got == 3:
                    stop(router.engines[0].proc, kill=True)
        assert 3 <= got < 3000
        poll(lambda: sum(w["inflight"] for w in router.workers().values()) == 0, "released")
        assert 'outcome="upstream_broken"' in router.metrics()
        poll(
            lambda: router.dashboard()["outcomes"].get("upstream_broken") == 1,
            "the dashboard counts the broken stream",
        )
    finally:
        shutdown(router)
