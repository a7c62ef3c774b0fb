"""A real ``kvroute engine`` process (the tiny tokenizer) against the official ``openai``
client, checked against what vLLM 0.33's OpenAI server answers (read from its source:
``vllm/entrypoints/openai/{completion,chat_completion}/{serving,protocol}.py``,
``vllm/sampling_params.py``, ``vllm/entrypoints/serve/instrumentator/basic.py``,
``vllm/v1/metrics/loggers.py``)."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from _helpers import poll, stop_process

from router.netutil import free_ports

REPO = Path(__file__).resolve().parents[2]
MODEL = "tiny"
CHAT = [{"role": "user", "content": "kabe dodo"}]


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    (port,) = free_ports(1)
    cmd = [
        sys.executable, "-m", "router.cli", "engine", "--port", str(port), "--worker-id", "api",
        "--publish", "", "--replay", "", "--gpu-blocks", "64", "--cpu-blocks", "0",
        "--tokenizer", str(REPO / "router/proxy/data/tiny"), "--served-model-name", MODEL,
        "--token-delay-ms", "2",
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"

    def up() -> bool:
        assert proc.poll() is None, "kvroute engine exited"
        try:
            return httpx.get(f"{base}/health", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        poll(up, "kvroute engine up", timeout=60)
        yield base
    finally:
        stop_process(proc)


@pytest.fixture
def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="-", max_retries=0, timeout=30)


def test_continuous_usage_stats_put_usage_on_every_chunk(client: openai.OpenAI) -> None:
    options: Any = {"include_usage": True, "continuous_usage_stats": True}
    chunks = list(
        client.chat.completions.create(
            model=MODEL, messages=CHAT, max_tokens=3, stream=True, stream_options=options
        )
    )
    assert all(c.usage is not None for c in chunks)
    prompt = chunks[-1].usage.prompt_tokens  # type: ignore[union-attr]
    # The role chunk, three tokens, then the final usage chunk.
    assert [(c.usage.prompt_tokens, c.usage.completion_tokens) for c in chunks] == [  # type: ignore[union-attr]
        (prompt, 0), (prompt, 1), (prompt, 2), (prompt, 3), (prompt, 3),
    ]  # fmt: skip
    # Completions: per choice, counting that choice's tokens.
    chunks = list(
        client.completions.create(
            model=MODEL, prompt="kabe", max_tokens=2, n=2, stream=True, stream_options=options
        )
    )
    per_choice = [(c.choices[0].index, c.usage.completion_tokens) for c in chunks if c.choices]  # type: ignore[union-attr]
    assert per_choice == [(0, 1), (1, 1), (0, 2), (1, 2)]
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 4
    # Without include_usage, continuous_usage_stats adds nothing (vLLM's should_include_usage).
    options = {"continuous_usage_stats": True}
    chunks = list(
        client.completions.create(
            model=MODEL, prompt="kabe", max_tokens=2, stream=True, stream_options=options
        )
    )
    assert all(c.usage is None for c in chunks)


def test_stream_frames_like_vllm(client: openai.OpenAI) -> None:
    """Chat: one role chunk per choice; every chunk holds one choice; the last token's
    chunk carries finish_reason (no empty trailing chunk)."""
    chunks = list(
        client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=3, n=2, stream=True)
    )
    assert all(len(c.choices) == 1 for c in chunks)
    roles = [c.choices[0].index for c in chunks if c.choices[0].delta.role == "assistant"]
    assert roles == [0, 1] and len(chunks) == 2 + 2 * 3
    for i in (0, 1):
        mine = [c.choices[0] for c in chunks if c.choices[0].index == i]
        assert [ch.finish_reason for ch in mine] == [None, None, None, "length"]
        assert mine[-1].delta.content  # the finish rides on the last token
        assert mine[-1].model_extra == {"stop_reason": None}
    chunks = list(client.completions.create(model=MODEL, prompt="kabe", max_tokens=3, stream=True))
    assert [c.choices[0].finish_reason for c in chunks] == [None, None, "length"]
    assert all(c.choices[0].text for c in chunks)
    assert all(c.choices[0].model_extra == {"stop_reason": None} for c in chunks)
    reply = client.completions.create(model=MODEL, prompt="kabe", max_tokens=1)
    assert reply.choices[0].model_extra == {"stop_reason": None}


def test_echo_prepends_the_prompt(client: openai.OpenAI) -> None:
    plain = client.completions.create(model=MODEL, prompt="kabe dodo", max_tokens=2)
    echoed = client.completions.create(model=MODEL, prompt="kabe dodo", max_tokens=2, echo=True)
    assert echoed.choices[0].text == "kabe dodo" + plain.choices[0].text
    assert echoed.usage.completion_tokens == 2  # type: ignore[union-attr]
    # max_tokens 0 with echo: the prompt alone (vLLM refuses 0 only without echo).
    only = client.completions.create(model=MODEL, prompt="kabe dodo", max_tokens=0, echo=True)
    assert only.choices[0].text == "kabe dodo"
    streamed = client.completions.create(
        model=MODEL, prompt="kabe dodo", max_tokens=2, echo=True, stream=True
    )
    assert "".join(c.choices[0].text for c in streamed) == echoed.choices[0].text


def test_logprobs_have_vllms_shape(client: openai.OpenAI) -> None:
    reply = client.completions.create(model=MODEL, prompt="kabe", max_tokens=3, logprobs=2)
    lp = reply.choices[0].logprobs
    assert lp is not None and lp.tokens is not None and lp.top_logprobs is not None
    assert "".join(lp.tokens) == reply.choices[0].text
    assert lp.token_logprobs == [0.0, 0.0, 0.0]
    assert lp.text_offset == [len("".join(lp.tokens[:i])) for i in range(3)]
    assert all(
        len(top) == 2 and top[t] == 0.0 for top, t in zip(lp.top_logprobs, lp.tokens, strict=True)
    )
    chat = client.chat.completions.create(
        model=MODEL, messages=CHAT, max_tokens=2, logprobs=True, top_logprobs=3
    )
    content = chat.choices[0].logprobs.content  # type: ignore[union-attr]
    assert (
        content is not None and "".join(c.token for c in content) == chat.choices[0].message.content
    )
    assert all(c.logprob == 0.0 and len(c.top_logprobs) == 3 for c in content)
    assert all(c.top_logprobs[0].token == c.token for c in content)
    streamed = client.chat.completions.create(
        model=MODEL, messages=CHAT, max_tokens=2, logprobs=True, stream=True
    )
    got = [c.choices[0].logprobs for c in streamed if c.choices[0].delta.content]
    assert [len(g.content or []) for g in got if g is not None] == [1, 1]
    assert client.completions.create(model=MODEL, prompt="kabe").choices[0].logprobs is None


@pytest.mark.parametrize(
    ("path", "body", "message"),
    [
        (
            "/completions",
            {"prompt": "kabe", "max_tokens": 0},
            "max_tokens must be at least 1, got 0.",
        ),
        (
            "/completions",
            {"prompt": "kabe", "max_tokens": -3},
            "max_tokens must be at least 1, got -3.",
        ),
        ("/chat/completions", {"messages": CHAT, "max_completion_tokens": 0}, "got 0"),
        (
            "/completions",
            {"prompt": "kabe", "stream_options": {"include_usage": True}},
            "Stream options",
        ),
        (
            "/chat/completions",
            {"messages": CHAT, "stream_options": {"include_usage": False}},
            "Stream options",
        ),
        ("/completions", {"prompt": "kabe", "cache_salt": "a/b"}, "cache_salt"),
        ("/completions", {"prompt": "kabe", "cache_salt": "s" * 129}, "cache_salt"),
        ("/completions", {"prompt": "kabe", "cache_salt": ""}, "non-empty"),
        ("/completions", {"prompt": "kabe", "logprobs": 21}, "greater than max allowed: 20"),
        ("/chat/completions", {"messages": CHAT, "top_logprobs": 2}, "`logprobs` must be set"),
    ],
)
def test_what_vllm_refuses_is_a_400(
    client: openai.OpenAI, path: str, body: dict[str, Any], message: str
) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client.post(path, body={"model": MODEL, **body}, cast_to=httpx.Response)
    assert message in str(err.value)


def test_what_vllm_accepts_is_served(url: str) -> None:
    for body in (
        {"prompt": "kabe", "model": ""},  # an empty name is the served model
        {"prompt": "kabe", "stream_options": {}},  # empty options are no options
        {"prompt": "kabe", "max_tokens": None, "cache_salt": "s" * 128},
    ):
        r = httpx.post(f"{url}/v1/completions", json=body, timeout=30)
        assert r.status_code == 200, (body, r.text)
        assert r.json()["model"] == MODEL
    r = httpx.post(f"{url}/v1/completions", json={"prompt": "kabe", "model": "gpt"}, timeout=30)
    assert r.status_code == 404
    assert (
        r.json()["error"]["message"] == f"The model `gpt` does not exist. Valid aliases: {MODEL}."
    )


def test_version_and_vllm_metrics(client: openai.OpenAI, url: str) -> None:
    assert httpx.get(f"{url}/version").json() == {"version": "0.33.0"}

    def scrape() -> dict[str, float]:
        text = httpx.get(f"{url}/metrics", timeout=10).text
        out = {}
        for line in text.splitlines():
            if line.startswith("vllm:"):
                name, value = line.rsplit(" ", 1)
                out[name.split("{")[0]] = float(value)
        return out

    before = scrape()
    client.completions.create(model=MODEL, prompt=[5] * 40, max_tokens=4)
    client.completions.create(model=MODEL, prompt=[5] * 40, max_tokens=4)
    after = scrape()
    assert after["vllm:prompt_tokens_total"] - before["vllm:prompt_tokens_total"] == 80
    assert after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"] == 8
    assert after["vllm:prefix_cache_hits_total"] - before["vllm:prefix_cache_hits_total"] == 32
    assert after["vllm:request_success_total"] - before["vllm:request_success_total"] == 2
    assert after["vllm:num_requests_waiting"] == 0 and after["vllm:kv_cache_usage_perc"] == 0
    # A stream is running until it ends.
    stream = client.completions.create(model=MODEL, prompt="kabe", max_tokens=2000, stream=True)
    first = threading.Event()

    def read() -> None:
        for _ in stream:
            first.set()

    reader = threading.Thread(target=read)
    reader.start()
    assert first.wait(30)
    assert scrape()["vllm:num_requests_running"] == 1
    reader.join(60)
    poll(lambda: scrape()["vllm:num_requests_running"] == 0, "the stream ended")


def test_tokenize_returns_token_strs_on_request(url: str) -> None:
    body = {"model": MODEL, "prompt": "kabe dodo"}
    r = httpx.post(f"{url}/tokenize", json=body, timeout=30).json()
    assert r["token_strs"] is None
    r = httpx.post(f"{url}/tokenize", json={**body, "return_token_strs": True}, timeout=30).json()
    assert r["token_strs"] == ["<s>", "kabe", "dodo"] and len(r["tokens"]) == 3
