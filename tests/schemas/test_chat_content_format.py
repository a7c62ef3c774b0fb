"""The content format kvroute decides for a chat template is the one vLLM 0.33 detects
(``--chat-template-content-format auto``), rule by rule: recorded from vLLM's own
detection for template snippets (tests/schemas/parity/chat_cases_content.py) into
tests/fixtures/vllm-chat/recording.json, replayed here without vLLM. The renders that
follow from it are held to vLLM in test_chat_parity_vllm.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from schemas.tokenization import ModelTokenizer
from schemas.tokenization.content_format import detect_content_format
from schemas.tokenization.template_env import _jinja_env

ROOT = Path(__file__).resolve().parents[2]
RECORDING = json.loads(
    (ROOT / "tests" / "fixtures" / "vllm-chat" / "recording.json").read_text(encoding="utf-8")
)
FORMATS: list[dict[str, Any]] = RECORDING["content_formats"]
ENV = _jinja_env()


def test_recording_covers_both_formats() -> None:
    assert {f["format"] for f in FORMATS} == {"string", "openai"}
    assert len(FORMATS) >= 20


@pytest.mark.parametrize("case", FORMATS, ids=[f["name"] for f in FORMATS])
def test_detected_format_is_vllms(case: dict[str, Any]) -> None:
    assert detect_content_format(case["template"], ENV) == case["format"]


def test_format_follows_the_template_a_request_renders_with() -> None:
    tok = ModelTokenizer(ROOT / RECORDING["tokenizers"]["parts"])
    assert tok.content_format(None) == "openai"  # chat_template.jinja
    assert tok.content_format([]) == "string"  # tools: the "tool_use" template
    assert ModelTokenizer(ROOT / RECORDING["tokenizers"]["tiny"]).content_format() == "string"
