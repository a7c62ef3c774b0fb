"""``kvroute engine --prefill-us-per-token``: simulated prefill time for uncached tokens,
one prefill at a time (what makes TTFT in benchmarks/routing_live.py depend on hits)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import httpx
import pytest
from _helpers import serve_in_thread

from offload_core.engine import EngineConfig, SimEngine
from offload_core.engine_app import create_app
from offload_core.engine_cli import build_parser

PER_TOKEN_S = 0.01


@pytest.fixture
def base_url() -> Iterator[str]:
    engine = SimEngine(EngineConfig(worker_id="w0", groups="full:4", gpu_blocks=64, cpu_blocks=0))
    app = create_app(engine, prefill_s_per_token=PER_TOKEN_S)
    with serve_in_thread(app, start_s=20) as url:
        yield url
    engine.shutdown()


async def test_uncached_tokens_take_time_one_prefill_at_a_time(base_url: str) -> None:
    async with httpx.AsyncClient(base_url=base_url, timeout=30) as client:

        async def complete(prompt: list[int]) -> int:
            r = await client.post("/v1/completions", json={"prompt": prompt, "max_tokens": 1})
            assert r.status_code == 200, r.text
            return int(r.json()["usage"]["prompt_tokens_details"]["cached_tokens"])

        t0 = time.perf_counter()
        # Two different 20-token prompts at once: 40 uncached tokens, prefilled in turn.
        assert await asyncio.gather(complete(list(range(20))), complete(list(range(100, 120)))) == [
            0,
            0,
        ]
        assert time.perf_counter() - t0 >= 40 * PER_TOKEN_S
        # The same prompt again is a hit (its last block is recomputed, as vLLM does).
        assert await complete(list(range(20))) == 16


def test_cli_flag_reaches_the_parser() -> None:
    args = build_parser().parse_args(["--prefill-us-per-token", "250"])
    assert args.prefill_us_per_token == 250.0
    assert build_parser().parse_args([]).prefill_us_per_token == 0.0
