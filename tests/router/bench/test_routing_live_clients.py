"""benchmarks/routing_live.py closes its openai clients before the next way starts.

An unclosed ``AsyncOpenAI`` is a reference cycle, freed by the cyclic GC at some point
during the next way's first burst: its idle transports' finalizers close their sockets
(the fd numbers go to new connections at once) and openai's ``__del__`` schedules an
``aclose()`` that aborts those transports, removing the *new* connections' readers from
the event loop's selector by fd number; such a turn never reads its (fully sent) answer
and hangs until the harness's 30 s ``wait_for`` (``turns_retried_after_30s``). So
``chat()`` must leave no connection of its own open to the engines when it returns.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from _helpers import serve_in_thread

from benchmarks.routing_live import chat
from offload_core.engine import EngineConfig, SimEngine
from offload_core.engine_app import create_app
from router.proxy.tiny_tokenizer import words
from schemas.tokenization import ModelTokenizer

TINY = Path(__file__).resolve().parents[3] / "router/proxy/data/tiny"


@pytest.fixture
def engine_url() -> Iterator[str]:
    engine = SimEngine(EngineConfig(worker_id="w0", gpu_blocks=256, cpu_blocks=0))
    app = create_app(engine, tokenizer=ModelTokenizer(str(TINY)))
    with serve_in_thread(app) as url:
        yield url
    engine.shutdown()


def open_connections_to(port: int) -> int:
    """This process's TCP sockets (not yet closed by it) whose peer is 127.0.0.1:port."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    count = 0
    for line in Path("/proc/self/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        peer_port = int(fields[2].split(":")[1], 16)
        if peer_port == port and fields[9] in inodes:
            count += 1
    return count


class _Fleet:
    """What chat() reads of a fleet: one engine, clients straight to it (pinned)."""

    def __init__(self, url: str) -> None:
        self.args = argparse.Namespace(clients=3, output_words=4)
        self.way = "pinned"
        self.engines = [url]
        self.front = ""

    async def engine_prompt_tokens(self) -> list[int]:
        return [1]


async def test_chat_closes_its_clients(engine_url: str) -> None:
    port = int(engine_url.rsplit(":", 1)[1])
    w = words()
    convs = [
        [[{"role": "system", "content": " ".join(w[:20])}], [{"role": "user", "content": w[c]}]]
        for c in range(4)
    ]
    result = await chat(_Fleet(engine_url), convs)  # type: ignore[arg-type]
    assert result["requests"] == 4 and result["turns_retried_after_30s"] == 0
    # Without the close, the clients' idle keep-alive connections are still open here,
    # left for the garbage collector to tear down in the middle of the next way.
    assert open_connections_to(port) == 0


async def test_chat_traces_every_turn(engine_url: str) -> None:
    """``--trace``: one record per turn whose tokens add up to the run's totals (what a
    dip's analysis splits into routed estimates and hits lost before admission)."""
    w = words()
    convs = [
        [
            [{"role": "system", "content": " ".join(w[:40])}],
            [{"role": "user", "content": w[c]}],
            [{"role": "user", "content": w[c + 10]}],
        ]
        for c in range(3)
    ]
    turns: list[dict[str, object]] = []
    result = await chat(_Fleet(engine_url), convs, turns)  # type: ignore[arg-type]
    assert sorted((t["conversation"], t["turn"]) for t in turns) == [
        (c, t) for c in range(3) for t in range(2)
    ]
    assert sum(int(t["prompt"]) for t in turns) == result["prompt_tokens"]  # type: ignore[call-overload]
    assert sum(int(t["cached"]) for t in turns) == result["cached_tokens"] > 0  # type: ignore[call-overload]
    # Pinned: the engine each conversation was sent to; no router, so no estimate.
    assert {t["worker"] for t in turns} == {"e0"} and {t["estimated"] for t in turns} == {None}
