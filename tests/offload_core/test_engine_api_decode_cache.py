"""vLLM caches a request's full blocks of generated tokens, not only its prompt's: a
later turn that sends the answer back hits them. The simulated engine decoded stand-in
tokens, not the answer it returned, so a follow-up turn hit the prompt's blocks only."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from test_engine import Server

from offload_core.engine import EngineConfig, SimEngine


@pytest.fixture
def url() -> Iterator[str]:
    engine = SimEngine(
        EngineConfig(worker_id="w0", groups="full:4,swa:4:8", gpu_blocks=64, cpu_blocks=64)
    )
    with Server(engine) as base:
        yield base
    engine.shutdown()


def test_a_follow_up_that_sends_the_answer_back_hits_its_blocks(url: str) -> None:
    prompt = list(range(100, 109))  # 9 tokens: 2 full blocks of 4
    first = httpx.post(
        f"{url}/v1/completions",
        json={"prompt": prompt, "max_tokens": 9, "logprobs": 0, "return_tokens_as_token_ids": True},
        timeout=30,
    ).json()
    answer = [int(t.split(":")[1]) for t in first["choices"][0]["logprobs"]["tokens"]]
    assert len(answer) == 9 and first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    follow = httpx.post(
        f"{url}/v1/completions", json={"prompt": [*prompt, *answer, 5, 6, 7]}, timeout=30
    ).json()
    # 9 prompt + 8 decoded tokens were computed (the last sampled one never is): 4 full
    # blocks, 16 tokens, where the prompt alone holds 2.
    assert follow["usage"]["prompt_tokens_details"]["cached_tokens"] == 16


def test_each_choice_of_n_is_decoded_into_the_cache(url: str) -> None:
    """vLLM runs n > 1 as one child request per choice, each caching its own answer."""
    prompt = list(range(200, 209))
    first = httpx.post(
        f"{url}/v1/completions",
        json={
            "prompt": prompt,
            "max_tokens": 9,
            "n": 2,
            "logprobs": 0,
            "return_tokens_as_token_ids": True,
        },
        timeout=30,
    ).json()
    assert first["usage"]["prompt_tokens"] == 9  # the prompt counted once
    second = next(c for c in first["choices"] if c["index"] == 1)
    answer = [int(t.split(":")[1]) for t in second["logprobs"]["tokens"]]
    follow = httpx.post(
        f"{url}/v1/completions", json={"prompt": [*prompt, *answer, 5, 6, 7]}, timeout=30
    ).json()
    assert follow["usage"]["prompt_tokens_details"]["cached_tokens"] == 16
