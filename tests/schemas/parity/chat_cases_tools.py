"""The recorded chat cases on the ``tools`` test template
(tests/fixtures/vllm-chat/tools-tokenizer), which renders tools, documents, thinking
flags and every message field: the request fields and message rules that kvroute-tiny's
template never shows. Data only; apart from chat_cases.py to keep each list readable."""

from __future__ import annotations

from typing import Any

from chat_case_parts import CLOCK, DOCS, HI, TOOL_TURN, WEATHER, case

TOOLS_CASES: list[dict[str, Any]] = [
    # --- the tools template: tools, documents, thinking, tool calls all reach the prompt
    case("tools-plain", "tools"),
    case("tools-basic", "tools", tools=[WEATHER]),
    case(
        "tools-model-dump-shape",
        "tools",
        tools=[
            {
                "function": {
                    "parameters": {"zeta": 1, "alpha": {"b": None, "a": [1, "día"]}},
                    "strict": False,
                    "name": "gaga",
                    "extra": "dropped",
                },
                "type": "function",
                "also": "dropped",
            },
            {"function": {"name": "haha", "strict": "yes"}, "defer_loading": True},
            {
                "type": "function",
                "function": {"name": "kaka", "description": None, "defer_loading": False},
                "defer_loading": True,
            },
            {"type": "function", "function": {"name": "lala", "strict": None}},
        ],
    ),
    case(
        "tools-unicode",
        "tools",
        tools=[
            {
                "type": "function",
                "function": {"name": "gaga", "description": 'día ☃ \u2028 "q" <b>&'},
            }
        ],
        messages=[{"role": "user", "content": "día ☃"}],
    ),
    case("tools-tool-choice-none-keeps-tools", "tools", tools=[WEATHER], tool_choice="none"),
    case("tools-tool-choice-required", "tools", tools=[WEATHER, CLOCK], tool_choice="required"),
    case(
        "tools-tool-choice-named",
        "tools",
        tools=[WEATHER, CLOCK],
        tool_choice={"type": "function", "function": {"name": "haha"}},
    ),
    case(
        "tools-tool-choice-named-unknown",
        "tools",
        tools=[WEATHER],
        tool_choice={"type": "function", "function": {"name": "haha"}},
    ),
    case("tools-tool-choice-invalid", "tools", tools=[WEATHER], tool_choice="sometimes"),
    case("tools-null", "tools", tools=None),
    case("tools-bad-type", "tools", tools=[{"type": "custom", "function": {"name": "gaga"}}]),
    case("tools-no-function-name", "tools", tools=[{"type": "function", "function": {}}]),
    case(
        "tools-description-not-a-string",
        "tools",
        tools=[{"type": "function", "function": {"name": "gaga", "description": 5}}],
    ),
    case(
        "tools-parameters-not-an-object",
        "tools",
        tools=[{"type": "function", "function": {"name": "gaga", "parameters": [1]}}],
    ),
    case(
        "tools-strict-not-a-bool",
        "tools",
        tools=[{"type": "function", "function": {"name": "gaga", "strict": "perhaps"}}],
    ),
    case("tools-documents", "tools", documents=DOCS),
    case("tools-documents-not-strings", "tools", documents=[{"title": 1}]),
    case(
        "tools-kwargs-tools-and-documents-win-or-lose",
        "tools",
        tools=[WEATHER],
        chat_template_kwargs={
            "tools": [{"raw": "kept as sent", "function": {"name": "zaza"}}],
            "documents": [{"title": "kaka"}],
            "extra": {"b": 1, "a": "kake"},
        },
    ),
    case(
        "tools-kwargs-documents-lose-to-request",
        "tools",
        documents=DOCS,
        chat_template_kwargs={"documents": [{"title": "kaka"}], "tools": None},
    ),
    case("tools-reasoning-effort-low", "tools", reasoning_effort="low"),
    case("tools-reasoning-effort-none", "tools", reasoning_effort="none"),
    case(
        "tools-reasoning-effort-user-thinking-false",
        "tools",
        reasoning_effort="high",
        chat_template_kwargs={"enable_thinking": False},
    ),
    case(
        "tools-reasoning-effort-user-thinking-null",
        "tools",
        reasoning_effort="max",
        chat_template_kwargs={"enable_thinking": None},
    ),
    case(
        "tools-kwargs-reasoning-effort-only",
        "tools",
        chat_template_kwargs={"reasoning_effort": "medium"},
    ),
    case(
        "tools-reasoning-effort-overrides-kwargs",
        "tools",
        reasoning_effort="minimal",
        chat_template_kwargs={"reasoning_effort": "medium"},
    ),
    case("tools-reasoning-effort-invalid", "tools", reasoning_effort="extreme"),
    case(
        "tools-kwargs-enable-thinking-auto",
        "tools",
        reasoning_effort="low",
        chat_template_kwargs={"enable_thinking": "auto"},
    ),
    case("tools-tool-calls-and-results", "tools", tools=[WEATHER, CLOCK], messages=TOOL_TURN),
    case(
        "tools-tool-call-fields",
        "tools",
        messages=[
            {
                "role": "assistant",
                "content": "baba",
                "tool_calls": [
                    {
                        "function": {"name": "gaga", "extra": 1, "arguments": '{"b": 1, "a": [2]}'},
                        "id": "c1",
                        "type": "function",
                        "index": 0,
                    }
                ],
            },
            {"role": "tool", "content": "babe", "tool_call_id": "c1", "name": None},
            {"role": "user", "content": "babi"},
        ],
    ),
    case(
        "tools-empty-tool-calls",
        "tools",
        messages=[{"role": "assistant", "content": "baba", "tool_calls": []}, *HI],
    ),
    case(
        "tools-null-tool-calls",
        "tools",
        messages=[{"role": "assistant", "content": "baba", "tool_calls": None}, *HI],
    ),
    case(
        "tools-tool-call-arguments-object",
        "tools",
        messages=[
            {
                "role": "assistant",
                "content": "baba",
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "gaga", "arguments": {"gago": "lala"}},
                    }
                ],
            },
            *HI,
        ],
    ),
    case(
        "tools-tool-call-without-id",
        "tools",
        messages=[
            {
                "role": "assistant",
                "content": "baba",
                "tool_calls": [{"type": "function", "function": {"name": "g", "arguments": ""}}],
            },
            *HI,
        ],
    ),
    case(
        "tools-custom-tool-call",
        "tools",
        messages=[
            {
                "role": "assistant",
                "content": "baba",
                "tool_calls": [
                    {"id": "c1", "type": "custom", "custom": {"name": "gaga", "input": "x"}}
                ],
            },
            *HI,
        ],
    ),
    case(
        "tools-reasoning-fields",
        "tools",
        messages=[
            {"role": "user", "content": "baba"},
            {"role": "assistant", "content": "babe", "reasoning_content": "babi"},
            {"role": "user", "content": "babo"},
            {
                "role": "assistant",
                "content": "babu",
                "reasoning": "bada",
                "reasoning_content": "bade",
            },
            {"role": "user", "content": "badi", "reasoning": "dropped"},
        ],
    ),
    case(
        "tools-name-task-and-unknown-fields",
        "tools",
        messages=[
            {"role": "system", "content": "baba", "name": "babe", "task": "babi"},
            {"role": "user", "content": "babo", "name": "bado", "task": None, "weight": 1},
            {"role": "assistant", "content": "babu", "tool_call_id": "x", "refusal": "no"},
            {"role": "tool", "content": "bada", "tool_call_id": None},
            {"role": "user", "content": "bade"},
        ],
    ),
    case(
        "tools-developer-with-tools",
        "tools",
        messages=[
            {"role": "developer", "content": "baba", "tools": [CLOCK]},
            {"role": "user", "content": "babe"},
            {"role": "developer", "content": "babi"},
        ],
    ),
    case("tools-raise-exception", "tools", messages=[{"role": "banned", "content": "baba"}]),
    case(
        "tools-continue-final-message",
        "tools",
        tools=[CLOCK],
        documents=DOCS[:1],
        reasoning_effort="low",
        messages=[
            *HI,
            {"role": "assistant", "content": "babi babo", "reasoning_content": "bada"},
        ],
        add_generation_prompt=False,
        continue_final_message=True,
    ),
    case(
        "tools-everything",
        "tools",
        tools=[WEATHER, CLOCK],
        tool_choice="auto",
        documents=DOCS,
        reasoning_effort="xhigh",
        chat_template_kwargs={"extra": [1, "kake"], "enable_thinking": True},
        add_special_tokens=True,
        messages=[{"role": "system", "content": [{"type": "text", "text": "baba"}]}, *TOOL_TURN],
    ),
]
