"""A request's ``chat_template_kwargs`` reach the chat template as vLLM 0.33 passes them.

The expected renders were taken from vLLM 0.33's own path (``ChatCompletionRequest
.build_chat_params`` -> ``ChatParams.with_defaults`` -> ``safe_apply_chat_template`` with
transformers' ``apply_chat_template``) on the same tokenizer and templates.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from router.proxy.tiny_tokenizer import DEFAULT_DIR
from schemas.tokenization import ModelTokenizer, TokenizationError

# Shows every variable a request's kwargs could touch.
PROBE = (
    "{{ bos_token }}|{{ eos_token }}|agp={{ add_generation_prompt }}"
    "|tools={{ 'none' if tools is none else tools }}"
    "|docs={{ 'none' if documents is none else documents }}"
    "|cfm={{ continue_final_message is defined }}|tok={{ tokenize is defined }}"
    "|x={{ x }}{% for m in messages %}|{{ m['role'] }}:{{ m['content'] }}{% endfor %}"
)
HI = [{"role": "user", "content": "hi"}]
TAIL = "|tools=none|docs=none|cfm=False|tok=False|x=|user:hi"


def tokenizer_with(tmp_path: Path, template: str) -> ModelTokenizer:
    """The shipped tiny tokenizer with another chat template."""
    shutil.copy(DEFAULT_DIR / "tokenizer.json", tmp_path / "tokenizer.json")
    config = json.loads((DEFAULT_DIR / "tokenizer_config.json").read_text(encoding="utf-8"))
    config["chat_template"] = template
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    return ModelTokenizer(tmp_path)


@pytest.fixture
def probe(tmp_path: Path) -> ModelTokenizer:
    return tokenizer_with(tmp_path, PROBE)


@pytest.mark.parametrize(
    ("extra", "add_generation_prompt", "rendered"),
    [
        (None, True, "<s>|</s>|agp=True" + TAIL),
        # The request's own add_generation_prompt wins over the kwarg, either way.
        ({"add_generation_prompt": False}, True, "<s>|</s>|agp=True" + TAIL),
        ({"add_generation_prompt": True}, False, "<s>|</s>|agp=False" + TAIL),
        # The kwargs win over the special tokens.
        ({"bos_token": "B", "eos_token": "E"}, True, "B|E|agp=True" + TAIL),
        # None and "auto" are unset values: dropped.
        ({"bos_token": None, "eos_token": "auto"}, True, "<s>|</s>|agp=True" + TAIL),
        (
            {"messages": None, "conversation": None, "chat_template": None},
            True,
            "<s>|</s>|agp=True" + TAIL,
        ),
        (
            {"tools": [{"t": 1}], "documents": [{"d": 2}]},
            True,
            "<s>|</s>|agp=True|tools=[{'t': 1}]|docs=[{'d': 2}]|cfm=False|tok=False|x=|user:hi",
        ),
        # apply_chat_template's own arguments never reach the template.
        (
            {"continue_final_message": True, "tokenize": False, "padding": True},
            True,
            "<s>|</s>|agp=True" + TAIL,
        ),
        ({"x": 7}, True, "<s>|</s>|agp=True|tools=none|docs=none|cfm=False|tok=False|x=7|user:hi"),
    ],
)
def test_kwargs_render_as_vllm_renders_them(
    probe: ModelTokenizer, extra: dict[str, Any] | None, add_generation_prompt: bool, rendered: str
) -> None:
    assert probe.render_chat(HI, add_generation_prompt, extra) == rendered


def test_shipped_template_with_colliding_kwargs() -> None:
    """The reported request: a kwarg the renderer also passes no longer crashes it."""
    tok = ModelTokenizer(DEFAULT_DIR)
    plain = tok.render_chat(HI)
    assert plain == "<s><|user|> hi <|end|> <|assistant|>"  # vLLM's render
    body: dict[str, Any] = {
        "messages": HI,
        "chat_template_kwargs": {"add_generation_prompt": False},
    }
    assert tok.encode_chat(body) == tok.encode(plain, add_special_tokens=False)
    body["chat_template_kwargs"] = {"bos_token": "BOS!", "eos_token": "EOS!"}
    assert tok.render_chat(HI, extra=body["chat_template_kwargs"]) == (
        "BOS!<|user|> hi <|end|> <|assistant|>"
    )
    assert tok.encode_chat(body) == tok.encode("BOS!" + plain[3:], add_special_tokens=False)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"messages": []}, "got multiple values for keyword argument 'messages'"),
        ({"messages": HI}, "got multiple values for keyword argument 'messages'"),
        ({"conversation": HI}, "'conversation' collides"),
        ({"chat_template": "{{ 'mine' }}"}, "Refused request with untrusted chat template"),
        ({"chat_template": "auto"}, "Refused request with untrusted chat template"),
    ],
)
def test_kwargs_vllm_refuses_are_tokenization_errors(extra: dict[str, Any], message: str) -> None:
    tok = ModelTokenizer(DEFAULT_DIR)
    with pytest.raises(TokenizationError, match=message):
        tok.render_chat(HI, extra=extra)
    with pytest.raises(TokenizationError, match=message):
        tok.encode_chat({"messages": HI, "chat_template_kwargs": extra})


def test_any_failing_template_call_is_a_tokenization_error(tmp_path: Path) -> None:
    tok = ModelTokenizer(DEFAULT_DIR)
    with pytest.raises(TokenizationError, match="keywords must be strings"):
        tok.render_chat(HI, extra={1: "not a name"})  # type: ignore[dict-item]
    calls_a_list = tokenizer_with(tmp_path, "{{ messages() }}")
    with pytest.raises(TokenizationError, match="'list' object is not callable"):
        calls_a_list.render_chat(HI)


def test_raise_exception_keeps_its_own_message(tmp_path: Path) -> None:
    tok = tokenizer_with(tmp_path, "{{ raise_exception('roles must alternate') }}")
    with pytest.raises(TokenizationError, match=r"^roles must alternate$"):
        tok.render_chat(HI)
