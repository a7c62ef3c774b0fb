"""``ModelTokenizer.encode_chat`` gives exactly the prompt token ids vLLM 0.33's OpenAI
server feeds its engine for a chat request, and refuses what vLLM refuses.

The expected answers were recorded from vLLM's own request -> prompt path
(``ChatCompletionRequest`` -> ``OnlineRenderer.render_chat`` -> transformers'
``apply_chat_template``) by tests/schemas/parity/record_vllm_chat.py
(``make record-chat-parity``) into tests/fixtures/vllm-chat/recording.json, on
kvroute-tiny, on a second template that renders tools, documents, thinking flags, tool
calls and every message field, on named templates, and on a template that loops over
content parts (vLLM passes it content as a list of parts) with a "tool_use" one that takes
strings; replayed here without vLLM (the content format detection itself:
test_chat_content_format.py).
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest

from schemas.tokenization import ModelTokenizer, TokenizationError

ROOT = Path(__file__).resolve().parents[2]
RECORDING = json.loads(
    (ROOT / "tests" / "fixtures" / "vllm-chat" / "recording.json").read_text(encoding="utf-8")
)
CASES: list[dict[str, Any]] = RECORDING["cases"]
ACCEPTED = [c for c in CASES if c["status"] == 200]
REFUSED = [c for c in CASES if c["status"] != 200]
# Refusals whose message kvroute gives word for word, as vLLM does.
SAME_MESSAGE = {
    "tiny-request-chat-template",
    "tiny-request-chat-template-empty",
    "tiny-kwargs-chat-template",
    "tiny-continue-and-generation-prompt",
    "tiny-continue-raw-truthiness",
    "tiny-continue-final-message-with-default-generation-prompt",
    "tiny-empty-tools",
    "tiny-tool-choice-without-tools",
    "tools-tool-choice-named-unknown",
    "tools-tool-choice-invalid",
    "tools-custom-tool-call",
    "tools-raise-exception",
    "tiny-kwargs-sanitize-control-tokens",
    "tiny-kwargs-assistant-mask",
    "tiny-empty-messages",
    "parts-continue-final-no-text",
}

_tokenizers: dict[str, ModelTokenizer] = {}


def tokenizer(name: str) -> ModelTokenizer:
    if name not in _tokenizers:
        _tokenizers[name] = ModelTokenizer(ROOT / RECORDING["tokenizers"][name])
    return _tokenizers[name]


def test_recording_is_vllm_0_33_and_covers_both_outcomes() -> None:
    assert RECORDING["vllm_version"] == "0.33.0"
    assert len(ACCEPTED) >= 30 and len(REFUSED) >= 20
    assert {c["tokenizer"] for c in ACCEPTED} == set(RECORDING["tokenizers"])
    assert all(c["status"] == 400 for c in REFUSED)
    assert {c["name"] for c in REFUSED} >= SAME_MESSAGE


@pytest.mark.parametrize("case", ACCEPTED, ids=[c["name"] for c in ACCEPTED])
def test_prompt_ids_are_vllms(case: dict[str, Any]) -> None:
    tok = tokenizer(case["tokenizer"])
    body = copy.deepcopy(case["body"])
    if case["prompt"] is not None:  # vLLM tokenized in the template call: no text kept
        assert tok.render_chat_request(body) == case["prompt"]
    assert tok.encode_chat(body) == case["prompt_token_ids"]
    assert body == case["body"]  # the proxy forwards the body: never edited


@pytest.mark.parametrize("case", REFUSED, ids=[c["name"] for c in REFUSED])
def test_vllms_refusals_are_tokenization_errors(case: dict[str, Any]) -> None:
    tok = tokenizer(case["tokenizer"])
    body = copy.deepcopy(case["body"])
    with pytest.raises(TokenizationError) as raised:
        tok.encode_chat(body)
    if case["name"] in SAME_MESSAGE:
        # VLLMValidationError's str() adds the parameter; the message is the same.
        assert str(raised.value) == re.sub(r" \(parameter=\w+\)$", "", case["message"])
    assert body == case["body"]
