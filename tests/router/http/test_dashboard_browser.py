"""End to end in a real browser: two ``kvroute engine`` processes publish over ZMQ, the
router (uvicorn, free port) subscribes to them, traffic is routed with ``/v1/route`` and
served by the engines, and headless Chromium shows the dashboard moving live.

Chromium is Debian's ``/usr/bin/chromium`` (``make system-deps`` installs it) driven by
Playwright; ``playwright install`` is never needed. The screenshot lands in
``artifacts/dashboard.png``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from _helpers import poll, stop_process

from router.config import RouterSettings
from router.http import create_app
from router.http.stream import close_streams_on_exit
from router.netutil import free_port, listen_socket

ROOT = Path(__file__).resolve().parents[3]
ARTIFACTS = ROOT / "artifacts"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
START_DEADLINE_S = 90.0  # torch import on a loaded 2-core machine
DEADLINE_S = 30.0
BLOCK = 16
SYSTEM_PROMPT = list(range(1, 4 * BLOCK + 1))


class Engine:
    """One ``kvroute engine`` subprocess with its HTTP, PUB and replay ports."""

    def __init__(self, worker_id: str, log_dir: Path) -> None:
        self.worker_id = worker_id
        self.http_port, self.pub_port, self.replay_port = free_port(), free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.http_port}"
        self.log_path = log_dir / f"{worker_id}.log"
        cmd = [
            sys.executable,
            "-m",
            "router.cli",
            "engine",
            "--worker-id",
            worker_id,
            "--port",
            str(self.http_port),
            "--publish",
            f"tcp://127.0.0.1:{self.pub_port}",
            "--replay",
            f"tcp://127.0.0.1:{self.replay_port}",
            "--groups",
            f"full:{BLOCK},swa:{BLOCK}:64",
            "--gpu-blocks",
            "48",
            "--cpu-blocks",
            "256",
            "--device",
            "cpu",
            "--log-level",
            "warning",
        ]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)

    def spec(self) -> dict[str, Any]:
        return {
            "worker_id": self.worker_id,
            "endpoint": f"tcp://127.0.0.1:{self.pub_port}",
            "replay_endpoint": f"tcp://127.0.0.1:{self.replay_port}",
            "http_endpoint": self.url,
        }

    def healthy(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(
                f"engine {self.worker_id} exited: {self.log_path.read_text()[-2000:]}"
            )
        try:
            return httpx.get(f"{self.url}/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def stop(self) -> None:
        stop_process(self.proc, grace_s=10, kill_wait_s=10)


class RouterThread:
    """The router app under uvicorn, in a thread with its own event loop."""

    def __init__(self, period_s: float) -> None:
        self.app = create_app(settings=RouterSettings(replay_timeout_s=2.0))
        self.app.state.stream_hub.period_s = period_s
        self.sock = listen_socket()
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        config = uvicorn.Config(self.app, log_level="warning", lifespan="on", access_log=False)
        self.server = uvicorn.Server(config)
        close_streams_on_exit(self.server, self.app)  # an open page must not hold shutdown
        self.thread = threading.Thread(
            target=lambda: asyncio.run(self.server.serve(sockets=[self.sock])), daemon=True
        )
        self.thread.start()
        poll(
            lambda: self.server.started or not self.thread.is_alive(),
            "router start",
            DEADLINE_S,
            interval=0.05,
        )
        assert self.thread.is_alive(), "router exited at start-up"

    def stop(self) -> None:
        self.server.handle_exit(signal.SIGTERM, None)  # as `kill` would (no re-raise: not main)
        self.thread.join(DEADLINE_S)
        self.sock.close()
        assert not self.thread.is_alive(), "router did not stop"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RouterThread, list[Engine]]]:
    if not Path(CHROMIUM).exists() or shutil.which("chromium") is None:
        pytest.fail(
            f"{CHROMIUM} not found: the browser test needs Debian's chromium "
            "(`apt-get install -y chromium`, or `make system-deps`)",
            pytrace=False,
        )
    log_dir = tmp_path_factory.mktemp("engines")
    engines = [Engine(f"w{i}", log_dir) for i in range(2)]
    router: RouterThread | None = None
    try:
        router = RouterThread(period_s=0.5)
        for engine in engines:
            poll(engine.healthy, f"engine {engine.worker_id} /health", START_DEADLINE_S, 0.05)
            r = httpx.post(f"{router.url}/v1/workers", json=engine.spec(), timeout=10)
            assert r.status_code == 201, r.text
        yield router, engines
    finally:
        if router is not None:
            router.stop()
        for engine in engines:
            engine.stop()


def drive(router: RouterThread, engines: list[Engine], n: int, rng: random.Random) -> int:
    """Route ``n`` chat-like requests and serve them on the chosen engines; returns the
    prompt tokens the engines reported as cached."""
    by_id = {e.worker_id: e for e in engines}
    cached = 0
    with httpx.Client(timeout=30) as client:
        for i in range(n):
            suffix = [rng.randrange(100, 50_000) for _ in range(rng.randrange(2, 6) * BLOCK)]
            prompt = SYSTEM_PROMPT + suffix
            body: dict[str, Any] = {"token_ids": prompt}
            if i % 2:  # a baseline now and then, so every engine gets traffic
                body["policy"] = "round_robin"
            r = client.post(f"{router.url}/v1/route", json=body)
            assert r.status_code == 200, r.text
            decision = r.json()
            engine = by_id[decision["worker_id"]]
            done = client.post(f"{engine.url}/v1/completions", json={"prompt": prompt})
            assert done.status_code == 200, done.text
            cached += done.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
            client.post(f"{router.url}/v1/requests/{decision['request_id']}/finish")
    return cached


def wait_js(page: Any, router: RouterThread, expression: str, what: str, arg: Any = None) -> None:
    """``page.wait_for_function`` that, on timeout, says what the page and router showed."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    try:
        page.wait_for_function(expression, arg=arg, timeout=DEADLINE_S * 1000)
    except PlaywrightTimeout:
        shown = page.evaluate("document.querySelector('main').innerText")
        workers = httpx.get(f"{router.url}/v1/workers", timeout=10).text
        raise AssertionError(
            f"page never showed {what}\npage: {shown}\nrouter: {workers}"
        ) from None


def test_dashboard_shows_the_fleet_live(fleet: tuple[RouterThread, list[Engine]]):
    from playwright.sync_api import sync_playwright

    router, engines = fleet
    rng = random.Random(7)
    errors: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1366, "height": 768})
            page.on("pageerror", lambda exc: errors.append(f"pageerror: {exc}"))
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.goto(router.url + "/", wait_until="domcontentloaded")

            # Both workers appear, connected, before any traffic.
            for engine in engines:
                page.wait_for_selector(
                    f"#worker-{engine.worker_id}[data-state='connected']", timeout=20_000
                )
            page.wait_for_selector("#conn.conn-live", timeout=10_000)

            assert drive(router, engines, 6, rng) > 0  # the shared system prompt hits
            wait_js(
                page,
                router,
                "Number(document.querySelector('#total-gpu').dataset.value) > 0",
                "GPU blocks",
            )
            blocks_before = int(page.get_attribute("#total-gpu", "data-value") or 0) + int(
                page.get_attribute("#total-offloaded", "data-value") or 0
            )
            updates_before = int(page.get_attribute("body", "data-updates") or 0)
            assert page.locator("#routes tr[data-key]").count() >= 1
            assert "group 1 (swa 64)" in page.inner_text("#blocks-legend")

            # More traffic: the numbers on the page move without a reload.
            drive(router, engines, 14, rng)
            wait_js(
                page,
                router,
                """(before) => {
                    const v = (id) => Number(document.querySelector(id).dataset.value);
                    return v('#total-gpu') + v('#total-offloaded') > before;
                }""",
                f"more than {blocks_before} blocks",
                blocks_before,
            )
            wait_js(
                page,
                router,
                "Number(document.querySelector('#total-offloaded').dataset.value) > 0",
                "offloaded (CPU) blocks",
            )
            assert int(page.get_attribute("body", "data-updates") or 0) > updates_before
            assert page.locator("#blocks-chart path.series").count() >= 2
            routes = page.locator("#routes tr[data-key]")
            assert routes.count() >= 10
            assert any(
                int(routes.nth(i).locator("td.hit").get_attribute("data-hit") or 0) > 0
                for i in range(routes.count())
            )
            for engine in engines:
                row = page.locator(f"#worker-{engine.worker_id}")
                assert row.get_attribute("data-state") == "connected"
                assert "g0 full/16" in row.inner_text() and "g1 swa 64/16" in row.inner_text()
            assert page.get_attribute("#event-rate", "data-value") is not None
            # The OpenAI proxy panel lists every worker (live or not, and why).
            assert page.locator("#proxy tr[data-worker]").count() == len(engines)
            # gaps · replays · resyncs: no frame was lost (the replays are the initial
            # catch-up each subscription makes).
            gaps, _replays, resyncs = page.inner_text("#gap-summary").split(" · ")
            assert (gaps, resyncs) == ("0", "0")
            # One more summary, so the chart has its newest point in the picture.
            wait_js(
                page,
                router,
                "(n) => Number(document.body.dataset.updates) > n",
                "one more summary",
                int(page.get_attribute("body", "data-updates") or 0),
            )

            ARTIFACTS.mkdir(exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "dashboard.png"))
        finally:
            with contextlib.suppress(Exception):
                browser.close()
    assert not errors, errors
