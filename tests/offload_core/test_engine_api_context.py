"""``--max-model-len``: the engine lists its context and enforces it as vLLM 0.33 does
(``vllm/renderers/params.py`` ``TokenizeParams``, ``entrypoints/serve/utils/api_utils.py``
``get_max_tokens``, ``entrypoints/openai/models/serving.py``'s cards), against the
official ``openai`` client (uvicorn on 127.0.0.1, the tiny tokenizer)."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest
from _helpers import serve_in_thread

from offload_core.engine import EngineConfig, SimEngine
from offload_core.engine_app import create_app
from offload_core.engine_cli import build_parser
from offload_core.engine_context import DEFAULT_MAX_MODEL_LEN
from router.proxy.tiny_tokenizer import DEFAULT_DIR
from schemas.tokenization import ModelTokenizer

LIMIT = 64
MODEL = "tiny"


@pytest.fixture(scope="module")
def client() -> Iterator[openai.OpenAI]:
    engine = SimEngine(EngineConfig(worker_id="w0", gpu_blocks=64, cpu_blocks=0))
    app = create_app(
        engine,
        tokenizer=ModelTokenizer(DEFAULT_DIR),
        model=MODEL,
        lora_modules=["adapter"],
        max_model_len=LIMIT,
    )
    try:
        with serve_in_thread(app) as base:
            yield openai.OpenAI(base_url=f"{base}/v1", api_key="-", max_retries=0, timeout=30)
    finally:
        engine.shutdown()


def ids(n: int) -> list[int]:
    return [200 + i for i in range(n)]


def refused(call: object) -> dict[str, object]:
    """The error body of a call that must be a 400."""
    with pytest.raises(openai.BadRequestError) as err:
        call()  # type: ignore[operator]
    body = err.value.body
    assert isinstance(body, dict)
    return body


def test_the_base_models_card_lists_the_context(client: openai.OpenAI) -> None:
    cards = {m.id: m.model_dump() for m in client.models.list().data}
    assert cards[MODEL]["max_model_len"] == LIMIT
    assert "max_model_len" not in cards["adapter"]  # vLLM's adapter cards leave it unset


def test_a_prompt_longer_than_the_context_is_refused(client: openai.OpenAI) -> None:
    body = refused(lambda: client.completions.create(model=MODEL, prompt=ids(LIMIT + 2)))
    assert body["message"] == (
        f"This model's maximum context length is {LIMIT} tokens. However, your prompt "
        f"contains {LIMIT + 2} input tokens, which exceeds this limit even without any "
        "output tokens. Please reduce the length of the input prompt. "
        f"(parameter=input_tokens, value={LIMIT + 2})"
    )
    assert body["param"] == "input_tokens" and body["code"] == 400
    # One token over reads "at least": vLLM tokenizes text only up to the limit plus one.
    body = refused(lambda: client.completions.create(model=MODEL, prompt=ids(LIMIT + 1)))
    assert f"contains at least {LIMIT + 1} input tokens" in str(body["message"])


def test_an_output_limit_above_the_context_is_refused_naming_its_field(
    client: openai.OpenAI,
) -> None:
    body = refused(lambda: client.completions.create(model=MODEL, prompt="kabe", max_tokens=65))
    assert body["message"] == (
        f"max_tokens=65 cannot be greater than max_model_len={LIMIT}. Please request fewer "
        "output tokens. (parameter=max_tokens, value=65)"
    )
    assert body["param"] == "max_tokens"
    messages = [{"role": "user", "content": "kabe"}]
    body = refused(
        lambda: client.chat.completions.create(
            model=MODEL,
            messages=messages,
            max_completion_tokens=100,  # type: ignore[arg-type]
        )
    )
    assert body["param"] == "max_completion_tokens"


def test_the_answer_is_clamped_to_what_the_context_has_left(client: openai.OpenAI) -> None:
    out = client.completions.create(model=MODEL, prompt=ids(LIMIT - 4), max_tokens=10)
    assert out.usage is not None and out.usage.completion_tokens == 4
    assert out.choices[0].finish_reason == "length"
    # Nothing left: refused as vLLM's sampling parameters refuse max_tokens 0.
    body = refused(lambda: client.completions.create(model=MODEL, prompt=ids(LIMIT)))
    assert body["message"] == "max_tokens must be at least 1, got 0."


def test_the_flag_defaults_to_a_context_no_benchmark_reaches() -> None:
    assert build_parser().parse_args([]).max_model_len == DEFAULT_MAX_MODEL_LEN
    assert build_parser().parse_args(["--max-model-len", "4096"]).max_model_len == 4096
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--max-model-len", "0"])
