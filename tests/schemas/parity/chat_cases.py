"""The chat request bodies record_vllm_chat.py sends through vLLM's own code, in the order
they are recorded, and the tokenizer directories they name. Data only: adding or changing
a case never touches the vLLM driver, and the cases read without vLLM installed.

Each case is ``{"name", "tokenizer", "body"}``; names are stable, the replay test
(tests/schemas/test_chat_parity_vllm.py) refers to some of them.
"""

from __future__ import annotations

from typing import Any

from chat_case_parts import CLOCK, HI, WEATHER, case
from chat_cases_content import CONTENT_CASES
from chat_cases_tools import TOOLS_CASES

# name -> tokenizer directory, relative to the repository root.
TOKENIZERS = {
    "tiny": "router/proxy/data/tiny",
    "tools": "tests/fixtures/vllm-chat/tools-tokenizer",
    "named": "tests/fixtures/vllm-chat/named-tokenizer",
    "parts": "tests/fixtures/vllm-chat/parts-tokenizer",
}

TINY_CASES: list[dict[str, Any]] = [
    # --- kvroute-tiny's template (string content, no tools/documents variables)
    case("tiny-plain", "tiny"),
    case(
        "tiny-content-parts",
        "tiny",
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "baba"},
                    {"type": "text", "text": ""},
                    "babe",
                    {"type": "input_text", "text": "babi"},
                    {"type": "output_text", "text": "babo"},
                    {"type": "refusal", "refusal": "babu"},
                    {"type": "thinking", "thinking": "bada", "closed": True},
                ],
            }
        ],
    ),
    case(
        "tiny-null-content-and-extra-fields",
        "tiny",
        messages=[
            {"role": "user", "content": "baba", "foo": "babe", "name": "babi"},
            {"role": "assistant", "content": None, "refusal": "bado"},
            {"role": "user", "content": [{"type": "text", "text": "bada"}, "babo"]},
        ],
    ),
    case(
        "tiny-text-part-null",
        "tiny",
        messages=[{"role": "user", "content": [{"type": "text", "text": None}]}],
    ),
    case("tiny-system-null-content", "tiny", messages=[{"role": "system", "content": None}]),
    case("tiny-name-not-a-string", "tiny", messages=[{"role": "user", "content": "b", "name": 7}]),
    case("tiny-role-not-a-string", "tiny", messages=[{"role": 5, "content": "baba"}]),
    case("tiny-messages-not-a-list", "tiny", messages="baba"),
    case(
        "tiny-claude-billing-header",
        "tiny",
        messages=[
            {
                "role": "system",
                "content": [
                    {"type": "text", "text": "x-anthropic-billing-header: cch=1\nbaba babe"},
                    {"type": "text", "text": "x-anthropic-billing-header: cch=2"},
                    {"type": "text", "text": "babi"},
                ],
            },
            {"role": "system", "content": "x-anthropic-billing-header: cch=3\nbabo"},
            {"role": "user", "content": "x-anthropic-billing-header: cch=4\nbabu"},
        ],
    ),
    case(
        "tiny-developer-to-system",
        "tiny",
        messages=[
            {"role": "system", "content": "baba"},
            {"role": "user", "content": "babe"},
            {"role": "developer", "content": "babi"},
            {"role": "system", "content": ""},
            {"role": "user", "content": "babo"},
        ],
    ),
    case("tiny-tools-unused-by-template", "tiny", tools=[WEATHER]),
    case("tiny-add-special-tokens", "tiny", add_special_tokens=True),
    case("tiny-no-generation-prompt", "tiny", add_generation_prompt=False),
    case("tiny-lax-bools", "tiny", add_generation_prompt="no", add_special_tokens="on"),
    case("tiny-bad-bool", "tiny", add_generation_prompt="maybe"),
    case(
        "tiny-continue-raw-truthiness",
        "tiny",
        add_generation_prompt=True,
        continue_final_message="false",
    ),
    case(
        "tiny-continue-final-message",
        "tiny",
        messages=[*HI, {"role": "assistant", "content": "babi babo "}],
        add_generation_prompt=False,
        continue_final_message=True,
    ),
    case(
        "tiny-continue-final-message-with-default-generation-prompt",
        "tiny",
        messages=[*HI, {"role": "assistant", "content": "babi"}],
        continue_final_message=True,
    ),
    case(
        "tiny-continue-and-generation-prompt",
        "tiny",
        add_generation_prompt=True,
        continue_final_message=True,
    ),
    case("tiny-request-chat-template", "tiny", chat_template="{{ 'baba' }}"),
    case("tiny-request-chat-template-empty", "tiny", chat_template=""),
    case("tiny-kwargs-chat-template", "tiny", chat_template_kwargs={"chat_template": "x"}),
    case("tiny-kwargs-not-a-dict", "tiny", chat_template_kwargs="baba"),
    case("tiny-kwargs-a-list", "tiny", chat_template_kwargs=[["x", 1]]),
    case("tiny-kwargs-null", "tiny", chat_template_kwargs=None),
    case(
        "tiny-kwargs-overrides",
        "tiny",
        chat_template_kwargs={
            "bos_token": "babe",
            "add_generation_prompt": False,
            "continue_final_message": True,
            "padding": True,
            "unused": "auto",
        },
    ),
    case(
        "tiny-kwargs-sanitize-control-tokens",
        "tiny",
        chat_template_kwargs={"sanitize_control_tokens": True},
    ),
    case(
        "tiny-kwargs-assistant-mask",
        "tiny",
        chat_template_kwargs={"return_assistant_tokens_mask": True},
    ),
    case(
        "tiny-kwargs-tokenize",
        "tiny",
        chat_template_kwargs={"tokenize": True},
        add_special_tokens=True,
    ),
    case("tiny-kwargs-conversation", "tiny", chat_template_kwargs={"conversation": HI}),
    case("tiny-reasoning-effort-unused-by-template", "tiny", reasoning_effort="high"),
    case("tiny-tool-choice-without-tools", "tiny", tool_choice="auto"),
    case("tiny-tool-choice-none-without-tools", "tiny", tool_choice="none"),
    case("tiny-empty-tools", "tiny", tools=[]),
    case(
        "tiny-unknown-part-type",
        "tiny",
        messages=[{"role": "user", "content": [{"type": "baba", "text": "babe"}]}],
    ),
    case(
        "tiny-part-without-type", "tiny", messages=[{"role": "user", "content": [{"text": "babe"}]}]
    ),
    case("tiny-empty-messages", "tiny", messages=[]),
]

NAMED_CASES: list[dict[str, Any]] = [
    # --- named templates: chat_template.jinja is the default, tool_use.jinja for tools
    case("named-default", "named"),
    case(
        "named-default-generation-block",
        "named",
        messages=[
            *HI,
            {"role": "assistant", "content": "babi"},
            {"role": "user", "content": "babo"},
        ],
    ),
    case("named-tool-use-for-tools", "named", tools=[WEATHER, CLOCK]),
    case("named-tool-use-for-kwargs-tools", "named", chat_template_kwargs={"tools": [CLOCK]}),
    case("named-namespace-underscore", "named", messages=[{"role": "secret", "content": "b"}]),
]

CASES: list[dict[str, Any]] = [*TINY_CASES, *TOOLS_CASES, *NAMED_CASES, *CONTENT_CASES]
