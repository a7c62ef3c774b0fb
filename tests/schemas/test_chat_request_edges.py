"""Chat requests outside the vLLM recording (tests/fixtures/vllm-chat): the ones whose
prompt is more than text (routed on load, ``NotTokenizable``), named templates given in
``tokenizer_config.json``, and the template environment's clock."""

from __future__ import annotations

import json
import shutil
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from router.proxy.tiny_tokenizer import DEFAULT_DIR
from schemas.tokenization import ModelTokenizer, NotTokenizable, TokenizationError

HI = [{"role": "user", "content": "baba"}]
TOOL = {"type": "function", "function": {"name": "gaga"}}


def tokenizer_with(tmp_path: Path, template: Any) -> ModelTokenizer:
    shutil.copy(DEFAULT_DIR / "tokenizer.json", tmp_path / "tokenizer.json")
    config = json.loads((DEFAULT_DIR / "tokenizer_config.json").read_text(encoding="utf-8"))
    config["chat_template"] = template
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    return ModelTokenizer(tmp_path)


@pytest.mark.parametrize(
    "body",
    [
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
        {"messages": [{"role": "user", "content": [{"image_url": "http://x/y.png"}]}]},
        {"messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}]},
        {
            "messages": [
                *HI,
                {"role": "assistant", "content": "b", "reasoning": {"type": "prompt_embeds"}},
            ]
        },
        {"messages": HI, "chat_template_kwargs": {"tokenize": True, "truncation": True}},
        {"messages": HI, "chat_template_kwargs": {"tokenize": True, "sanitize_control_tokens": 1}},
    ],
)
def test_prompts_of_more_than_text_are_not_tokenizable(body: dict[str, Any]) -> None:
    with pytest.raises(NotTokenizable):
        ModelTokenizer(DEFAULT_DIR).encode_chat(body)


def test_named_templates_in_tokenizer_config(tmp_path: Path) -> None:
    tok = tokenizer_with(
        tmp_path,
        [
            {"name": "default", "template": "plain{{ tools is none }}"},
            {"name": "tool_use", "template": "tools{{ tools | length }}"},
        ],
    )
    assert tok.render_chat_request({"messages": HI}) == "plainTrue"
    assert tok.render_chat_request({"messages": HI, "tools": [TOOL, TOOL]}) == "tools2"
    kwarg_tools = {"messages": HI, "chat_template_kwargs": {"tools": [TOOL]}}
    assert tok.render_chat_request(kwarg_tools) == "tools1"


def test_named_templates_without_a_default(tmp_path: Path) -> None:
    tok = tokenizer_with(tmp_path, [{"name": "tool_use", "template": "t"}])
    assert tok.render_chat_request({"messages": HI, "tools": [TOOL]}) == "t"
    with pytest.raises(TokenizationError, match="no default"):
        tok.render_chat_request({"messages": HI})


def test_strftime_now(tmp_path: Path) -> None:
    tok = tokenizer_with(tmp_path, "{{ strftime_now('%Y') }}")
    assert tok.render_chat_request({"messages": HI}) in {
        str(datetime.now().year - 1),
        str(datetime.now().year),
    }


def test_tool_call_arguments_nested_too_deep_are_refused() -> None:
    call = {"id": "c", "type": "function", "function": {"name": "g", "arguments": "[" * 100_000}}
    body = {"messages": [{"role": "assistant", "content": "", "tool_calls": [call]}, *HI]}
    with pytest.raises(TokenizationError, match="nest too deeply"):
        ModelTokenizer(DEFAULT_DIR).encode_chat(body)
