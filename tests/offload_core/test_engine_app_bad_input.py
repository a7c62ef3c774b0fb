"""The engine's HTTP answers to bad chat-template kwargs and out-of-range token ids: a JSON
4xx like vLLM 0.33's, never a plain-text 500 (uvicorn on 127.0.0.1, the tiny tokenizer)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from _helpers import serve_in_thread

from offload_core.engine import EngineConfig, SimEngine
from offload_core.engine_app import DEFAULT_MODEL, create_app
from router.proxy.tiny_tokenizer import DEFAULT_DIR
from schemas.tokenization import ModelTokenizer

TOK = ModelTokenizer(DEFAULT_DIR)
MESSAGES = [{"role": "user", "content": "kabe"}]
CHAT_PATHS = ("/v1/chat/completions", "/tokenize")


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    engine = SimEngine(EngineConfig(worker_id="w0", gpu_blocks=64, cpu_blocks=0))
    try:
        with serve_in_thread(create_app(engine, tokenizer=TOK)) as base:
            yield base
    finally:
        engine.shutdown()


def post(url: str, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{url}{path}", json={"model": DEFAULT_MODEL, **body}, timeout=30)


def chat(url: str, path: str, kwargs: dict[str, Any]) -> httpx.Response:
    return post(url, path, {"messages": MESSAGES, "chat_template_kwargs": kwargs, "max_tokens": 1})


def json_error(r: httpx.Response, status: int) -> str:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json"), r.text
    error = r.json()["error"]
    assert (error["code"], error["type"]) == (400, "BadRequestError"), error  # vLLM's shape
    return str(error["message"])


@pytest.mark.parametrize(
    ("kwargs", "rendered"),
    [
        # The request's own add_generation_prompt (default true) wins, as in vLLM.
        ({"add_generation_prompt": False}, "<s><|user|> kabe <|end|> <|assistant|>"),
        ({"bos_token": "x"}, "x<|user|> kabe <|end|> <|assistant|>"),
        ({"eos_token": "x"}, "<s><|user|> kabe <|end|> <|assistant|>"),
    ],
)
def test_kwargs_the_renderer_also_passes_are_served(
    url: str, kwargs: dict[str, Any], rendered: str
) -> None:
    ids = TOK.encode(rendered, add_special_tokens=False)
    r = chat(url, "/tokenize", kwargs)
    assert r.status_code == 200, r.text
    assert r.json()["tokens"] == ids
    r = chat(url, "/v1/chat/completions", kwargs)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens"] == len(ids)


@pytest.mark.parametrize("path", CHAT_PATHS)
@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"messages": MESSAGES}, "got multiple values for keyword argument 'messages'"),
        ({"conversation": MESSAGES}, "'conversation' collides"),
        ({"chat_template": "{{ 'x' }}"}, "Refused request with untrusted chat template"),
    ],
)
def test_kwargs_vllm_refuses_are_a_json_400(
    url: str, path: str, kwargs: dict[str, Any], message: str
) -> None:
    assert message in json_error(chat(url, path, kwargs), 400)


@pytest.mark.parametrize(
    ("tokens", "bad"),
    [
        ([-1], -1),
        ([1180591620717411303424], 1180591620717411303424),
        ([1 << 32], 1 << 32),
        ([(1 << 63) - 1], (1 << 63) - 1),
        ([300, -5, 301], -5),
    ],
)
def test_detokenize_out_of_range_id_is_a_json_400(url: str, tokens: list[int], bad: int) -> None:
    message = json_error(post(url, "/detokenize", {"tokens": tokens}), 400)
    assert message == f"Token id {bad} is out of vocabulary"


def test_detokenize_past_the_vocabulary_decodes_to_nothing_like_vllm(url: str) -> None:
    """An id past the vocabulary but within the tokenizer's u32 is no error in vLLM 0.33:
    its tokenizer decodes it to nothing."""
    vocab = TOK.tokenizer.get_vocab_size()
    for tokens, text in (([vocab], ""), ([(1 << 32) - 1], ""), ([300, vocab, 301], "bika bike")):
        r = post(url, "/detokenize", {"tokens": tokens})
        assert r.status_code == 200, r.text
        assert r.json() == {"prompt": text}
