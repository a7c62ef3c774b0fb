"""500 ``/v1/stream`` clients on a real router process while it ingests and scores.

The router (``kvroute serve``, ``--stream-max-clients 500``) subscribes to a test-driven
publisher (XPUB + replay ROUTER over real ZMQ). 500 Server-Sent-Events clients connect;
the 501st is refused with 503 ``too_many_clients`` and counted in ``/metrics``. While
they listen, event batches are ingested and ``/v1/score`` is asked after each (200 at
least, and on until every client has had 3 summaries). Checked
at the end: every client got summaries, never more than the hub computed (one message per
tick, fanned out); every score answered; the router's RSS grew by a bounded amount; the
index equals the complete stream applied in order; and once the clients hang up the
router's client gauge returns to 0.
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from _helpers import FakeEngine, sse_events, stop_process, wait_until
from _kv_streams import Harness
from test_fault_injection import Stream

from router.index import make_index
from router.netutil import free_port

REPO = Path(__file__).resolve().parents[2]
W = "w0"
CLIENTS = 500
BATCHES = 200


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def _metric(text: str, name: str) -> float:
    m = re.search(rf"^{name} ([0-9.e+]+)$", text, re.MULTILINE)
    assert m is not None, f"{name} not in /metrics"
    return float(m.group(1))


@pytest.fixture
async def engine() -> AsyncIterator[FakeEngine]:
    eng = FakeEngine(buffer=100_000)
    yield eng
    await eng.close()


@pytest.mark.timeout(300)
async def test_500_stream_clients_during_ingest_and_scoring(
    engine: FakeEngine, tmp_path: Path
) -> None:
    port = free_port()
    spec = f"{W}={engine.endpoint},replay={engine.replay_endpoint}"
    cmd = [sys.executable, "-m", "router.cli", "serve", "--port", str(port), "--worker", spec]
    cmd += ["--stream-max-clients", str(CLIENTS), "--log-level", "warning"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVROUTE_")}
    with (tmp_path / "router.log").open("wb") as log:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=log)
    base = f"http://127.0.0.1:{port}"
    limits = httpx.Limits(max_connections=CLIENTS + 50, max_keepalive_connections=CLIENTS + 50)
    timeout = httpx.Timeout(30.0, read=None)
    async with httpx.AsyncClient(base_url=base, limits=limits, timeout=timeout) as http:

        async def up() -> bool:
            assert proc.poll() is None, (tmp_path / "router.log").read_text()
            try:
                return (await http.get("/healthz")).status_code == 200
            except httpx.HTTPError:
                return False

        try:
            await wait_until(up, what="router up", timeout=60)
            await engine.wait_subscribed()
            rss_before = _rss_mb(proc.pid)
            counts = [0] * CLIENTS
            ended = [False] * CLIENTS
            opened = asyncio.Event()
            connected = [0]

            async def listen(i: int) -> None:
                async with http.stream("GET", "/v1/stream") as r:
                    assert r.status_code == 200, await r.aread()
                    connected[0] += 1
                    if connected[0] == CLIENTS:
                        opened.set()
                    async for event, _id, _data in sse_events(r):
                        assert event == "summary"
                        counts[i] += 1
                ended[i] = True  # the server ended it: a slow client dropped, or shutdown

            tasks = [asyncio.create_task(listen(i)) for i in range(CLIENTS)]
            await asyncio.wait_for(opened.wait(), 120)

            async def all_listed() -> bool:
                text = (await http.get("/metrics")).text
                return _metric(text, "kvroute_stream_clients") == CLIENTS

            await wait_until(all_listed, what=f"{CLIENTS} stream clients", timeout=60)
            refused = await http.get("/v1/stream")
            assert refused.status_code == 503
            assert refused.json()["error"]["code"] == "too_many_clients"

            # Ingest and scoring while every client listens: at least BATCHES batches and
            # scores, and on until every client has had 3 summaries (bounded in count).
            ref = Harness.build(make_index("memory"))
            stream = Stream(21)
            latencies: list[float] = []

            def three_each() -> bool:
                return all(c >= 3 or e for c, e in zip(counts, ended, strict=True))

            i = 0
            while i < BATCHES or (not three_each() and i < 20 * BATCHES):
                b = stream.batch()
                await ref.ingestor.apply_batch(W, b)
                await engine.publish(b)
                t0 = time.monotonic()
                probe = stream.probes()[i % len(stream.probes())]
                r = await http.post("/v1/score", json={"token_ids": probe, "workers": [W]})
                latencies.append(time.monotonic() - t0)
                assert r.status_code == 200, r.text
                i += 1
            assert three_each(), "clients starved of summaries during ingest"

            last = engine.next_seq - 1

            async def synced() -> bool:
                info = (await http.get(f"/v1/workers/{W}")).json()
                return info["last_seq"].get("0") == last

            await wait_until(synced, what=f"seq {last} applied", timeout=60)
            wrong = 0
            for probe in stream.probes():
                r = await http.post("/v1/score", json={"token_ids": probe, "workers": [W]})
                want = (await ref.one(probe, W)).hit_tokens
                wrong += r.json()["workers"][0]["hit_tokens"] != want

            text = (await http.get("/metrics")).text
            computed = _metric(text, "kvroute_stream_summaries_total")
            dropped = _metric(text, "kvroute_stream_dropped_clients_total")
            assert _metric(text, "kvroute_stream_refused_clients_total") == 1
            rss_after = _rss_mb(proc.pid)

            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

            async def all_gone() -> bool:
                text = (await http.get("/metrics")).text
                return _metric(text, "kvroute_stream_clients") == 0

            await wait_until(all_gone, what="stream clients released", timeout=60)
            latencies.sort()
            print(
                f"\n{CLIENTS} SSE clients: summaries per client {min(counts)}..{max(counts)} "
                f"(hub computed {computed:.0f}), dropped {dropped:.0f}, refused 1; "
                f"{i} batches ingested and scored; /v1/score during the load: median "
                f"{latencies[len(latencies) // 2] * 1e3:.1f} ms, max "
                f"{latencies[-1] * 1e3:.1f} ms; router RSS {rss_before:.0f} -> "
                f"{rss_after:.0f} MB; {wrong} of {len(stream.probes())} probes wrong"
            )
            assert wrong == 0
            assert max(counts) <= computed  # one message per computed tick, never more
            assert computed < CLIENTS  # computed once per tick for everyone, not per client
            assert sum(ended) == dropped  # a stream ends early only when dropped, counted
            assert rss_after - rss_before < 200  # bounded: queues of 8 summaries per client
        finally:
            await asyncio.to_thread(stop_process, proc)
