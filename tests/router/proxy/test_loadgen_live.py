"""The compose fleet's load generator (deploy/loadgen.py) run as a real process with the
official ``openai`` client against ``kvroute serve`` and a ``kvroute engine``: what the
``loadgen`` service does, minus Docker (not available here; docs/proxy.md)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from _fleet import REPO, RouterProc, fleet, shutdown

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def router(tmp_path: Path) -> Iterator[RouterProc]:
    r = fleet(tmp_path, 1)
    yield r
    shutdown(r)


def test_loadgen_sends_multi_turn_chats_through_the_proxy(router: RouterProc) -> None:
    env = {
        **os.environ,
        "KVROUTE_URL": f"{router.url}/v1",
        "KVROUTE_LOADGEN_REQUESTS": "8",
        "KVROUTE_RPS": "50",
    }
    done = subprocess.run(
        [sys.executable, str(REPO / "deploy/loadgen.py")],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "8 requests, 0 failed" in done.stdout
    (worker,) = router.workers().values()
    assert worker["routed"] == 8
    assert 'kvroute_proxy_requests_total{endpoint="chat",outcome="ok"} 8.0' in router.metrics()
    # Later turns extend earlier ones: the engine reports cached prompt tokens.
    assert worker["cached_tokens"] > 0
