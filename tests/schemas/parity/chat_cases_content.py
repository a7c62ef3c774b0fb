"""The recorded chat cases on the content-parts test template
(tests/fixtures/vllm-chat/parts-tokenizer): its default template loops over a message's
content parts, so vLLM hands it content as a list of parts; its "tool_use" template
(requests with tools) takes strings, so the same messages are joined. Plus
``FORMAT_TEMPLATES``: template snippets whose content format vLLM's detection is recorded
for, one rule of it each. Data only; apart from chat_cases.py to keep each list readable.
"""

from __future__ import annotations

from typing import Any

from chat_case_parts import CLOCK, HI, TOOL_TURN, WEATHER, case

KINDS = [  # every text kind, an empty text, a plain string, extra fields
    {"type": "text", "text": "baba"},
    {"type": "text", "text": ""},
    "babe",
    {"type": "input_text", "text": "babi", "foo": "bago"},
    {"type": "output_text", "text": "babo"},
    {"type": "refusal", "refusal": "babu"},
    {"type": "thinking", "thinking": "bada", "closed": True, "signature": "bade"},
    {"type": "text", "text": "badi", "cache_control": {"type": "ephemeral"}, "zeta": None},
]
BILLING = [
    {"type": "text", "text": "x-anthropic-billing-header: cch=1\nbaba babe", "bage": 1},
    {"type": "text", "text": "x-anthropic-billing-header: cch=2"},
    "x-anthropic-billing-header: cch=3\nbabi",
    {"type": "text", "text": ""},
]

CONTENT_CASES: list[dict[str, Any]] = [
    # --- content parts: the default template loops over them ("openai" format)
    case("parts-string-content", "parts"),
    case(
        "parts-text-parts",
        "parts",
        messages=[
            {
                "role": "user",
                "content": [{"type": "text", "text": "baba"}, {"type": "text", "text": "babe"}],
            }
        ],
    ),
    case("parts-every-text-kind", "parts", messages=[{"role": "user", "content": KINDS}]),
    case(
        "parts-mixed-roles",
        "parts",
        messages=[
            {"role": "system", "content": "baba"},
            {"role": "user", "content": [{"type": "text", "text": "babe"}, "babi"]},
            {"role": "assistant", "content": "babo", "name": "badu"},
            {"role": "user", "content": [{"type": "text", "text": ""}]},
            {"role": "assistant", "content": [{"type": "text", "text": "bafa"}]},
            {"role": "user", "content": "bafe"},
        ],
    ),
    case("parts-tool-turn", "parts", messages=TOOL_TURN),
    case(
        "parts-tool-message-texts",
        "parts",
        messages=[
            *TOOL_TURN[:2],
            {
                "role": "tool",
                "tool_call_id": "call1",
                "content": [
                    {"type": "text", "text": "lali"},
                    {"type": "text", "text": ""},
                    {"type": "input_text", "text": "lalo", "foo": 1},
                ],
            },
            {"role": "tool", "tool_call_id": "call2", "content": []},
            {"role": "tool", "tool_call_id": "call3", "content": ""},
        ],
    ),
    case(
        "parts-tool-reference",
        "parts",
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "baba"},
                    {"type": "tool_reference", "name": "gaga"},
                    {"type": "tool_reference"},
                ],
            },
            {
                "role": "tool",
                "tool_call_id": "call1",
                "content": [
                    {"type": "text", "text": "lali"},
                    {"type": "tool_reference", "name": "haha"},
                ],
            },
        ],
    ),
    case(
        "parts-missing-and-null-content",
        "parts",
        messages=[
            {"role": "user"},
            {"role": "assistant", "content": None},
            {"role": "user", "content": "baba"},
        ],
    ),
    case(
        "parts-system-billing-header",
        "parts",
        messages=[
            {"role": "system", "content": BILLING},
            {"role": "system", "content": "x-anthropic-billing-header: cch=4\nbabo"},
            {"role": "user", "content": BILLING},
        ],
    ),
    case(
        "parts-developer-merged-into-system",
        "parts",
        messages=[
            {"role": "system", "content": [{"type": "text", "text": "baba"}, "babe"]},
            {"role": "developer", "content": [{"type": "text", "text": ""}, "babi"]},
            {"role": "user", "content": [{"type": "text", "text": "babo"}]},
            {"role": "developer", "content": [{"type": "tool_reference", "name": "gaga"}]},
        ],
    ),
    case(
        "parts-developer-alone",
        "parts",
        messages=[
            {"role": "developer", "content": [{"type": "text", "text": "baba"}, "babe"]},
            *HI,
        ],
    ),
    case(
        "parts-continue-final-message",
        "parts",
        messages=[
            *HI,
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "babi"},
                    {"type": "text", "text": "babo "},
                    {"type": "tool_reference", "name": "gaga"},
                ],
            },
        ],
        add_generation_prompt=False,
        continue_final_message=True,
    ),
    case(
        "parts-continue-final-string",
        "parts",
        messages=[*HI, {"role": "assistant", "content": "babi babo"}],
        add_generation_prompt=False,
        continue_final_message=True,
    ),
    case(
        "parts-continue-final-no-text",
        "parts",
        messages=[*HI, {"role": "assistant", "content": None}],
        add_generation_prompt=False,
        continue_final_message=True,
    ),
    case(
        "parts-unknown-part-type",
        "parts",
        messages=[{"role": "user", "content": [{"type": "baba", "text": "babe"}]}],
    ),
    # --- the same messages through the "tool_use" template: string content, parts joined
    case("parts-tools-string-content", "parts", tools=[WEATHER]),
    case(
        "parts-tools-joined",
        "parts",
        tools=[WEATHER, CLOCK],
        messages=[
            {"role": "system", "content": BILLING},
            {"role": "user", "content": KINDS},
            {"role": "assistant", "content": None},
            {"role": "user", "content": [{"type": "tool_reference", "name": "gaga"}, "baba"]},
        ],
    ),
    case(
        "parts-tools-tool-message-joined",
        "parts",
        tools=[WEATHER],
        messages=[
            *TOOL_TURN[:2],
            {
                "role": "tool",
                "tool_call_id": "call1",
                "content": [
                    {"type": "text", "text": "lali"},
                    {"type": "text", "text": ""},
                    {"type": "text", "text": "lalo"},
                ],
            },
        ],
    ),
    case(
        "parts-kwargs-tools-joined",
        "parts",
        chat_template_kwargs={"tools": [CLOCK]},
        messages=[{"role": "user", "content": KINDS}],
    ),
    case(
        "parts-tool-choice-none-joined",
        "parts",
        tools=[WEATHER],
        tool_choice="none",
        messages=[{"role": "user", "content": KINDS[:3]}],
    ),
]

_LOOP = "{% for m in messages %}{0}{% endfor %}"
_PARTS = "{% for p in m['content'] %}{{ p['text'] }}{% endfor %}"

# name -> template; record_vllm_chat.py records the content format vLLM detects for each.
FORMAT_TEMPLATES: dict[str, str] = {
    "string-only": _LOOP.replace("{0}", "{{ m['content'] }}"),
    "getitem": _LOOP.replace("{0}", _PARTS),
    "getattr": _LOOP.replace("{0}", "{% for p in m.content %}{{ p.text }}{% endfor %}"),
    "is-string-branch": _LOOP.replace(
        "{0}",
        "{% if m['content'] is string %}{{ m['content'] }}{% else %}" + _PARTS + "{% endif %}",
    ),
    "filtered": _LOOP.replace(
        "{0}",
        "{% for p in m['content'] | selectattr('type', 'equalto', 'text') %}{{ p.text }}"
        "{% endfor %}",
    ),
    "sliced": _LOOP.replace("{0}", "{% for p in m['content'][1:] %}{% endfor %}"),
    "loop-filter-clause": _LOOP.replace(
        "{0}", "{% for p in m.content if p.type == 'text' %}{% endfor %}"
    ),
    "messages-filtered": "{% for m in messages | reverse %}" + _PARTS + "{% endfor %}",
    "messages-sliced-alias": "{% set rest = messages[1:] %}{% set more = rest %}"
    "{% for m in more %}" + _PARTS + "{% endfor %}",
    "messages-self-assign": "{% set messages = messages[1:] %}{% for m in messages %}"
    + _PARTS
    + "{% endfor %}",
    "namespace-kwarg-alias": "{% set ns = namespace(rest=messages) %}{% for m in ns.rest %}"
    + _PARTS
    + "{% endfor %}",
    "namespace-attr-alias": "{% set ns = namespace(rest=[]) %}{% set ns.rest = messages %}"
    "{% for m in ns.rest %}" + _PARTS + "{% endfor %}",
    "namespace-getitem-not-followed": "{% set ns = namespace(rest=messages) %}"
    "{% for m in ns['rest'] %}" + _PARTS + "{% endfor %}",
    "content-variable-not-followed": _LOOP.replace(
        "{0}", "{% set c = m['content'] %}{% for p in c %}{% endfor %}"
    ),
    "content-named-variable": _LOOP.replace(
        "{0}", "{% set content = m['content'] %}{% for p in content %}{% endfor %}"
    ),
    "content-named-anything": "{% set content = 'baba' %}{% for p in content %}{% endfor %}",
    "other-loop-variable": "{% for x in items %}{% for p in x.content %}{% endfor %}{% endfor %}",
    "macro-positional": "{% macro show(c) %}{% for p in c %}{{ p.text }}{% endfor %}{% endmacro %}"
    + _LOOP.replace("{0}", "{{ show(m['content']) }}"),
    "macro-keyword": "{% macro show(x, c) %}{% for p in c %}{% endfor %}{% endmacro %}"
    + _LOOP.replace("{0}", "{{ show(1, c=m.content) }}"),
    "macro-content-param-fed": "{% macro show(content) %}{% if content is string %}{{ content }}"
    "{% else %}{% for p in content %}{% endfor %}{% endif %}{% endmacro %}"
    + _LOOP.replace("{0}", "{{ show(m['content']) }}"),
    "macro-content-param-unfed": "{% macro show(content) %}{% for p in content %}{% endfor %}"
    "{% endmacro %}" + _LOOP.replace("{0}", "{{ show(m.role) }}"),
    "macro-loops-other-param": "{% macro show(c, d) %}{% for p in d %}{% endfor %}{% endmacro %}"
    + _LOOP.replace("{0}", "{{ show(m.content, m.role) }}"),
    "macro-own-messages-loop": "{% macro show(msgs) %}{% for m in msgs %}"
    + _PARTS
    + "{% endfor %}{% endmacro %}{{ show(messages) }}",
    "generation-block": _LOOP.replace("{0}", "{% generation %}" + _PARTS + "{% endgeneration %}"),
    "tuple-target-over-messages": "{% for a, b in messages %}{% endfor %}"
    + _LOOP.replace("{0}", _PARTS),
    "tuple-target-over-content": _LOOP.replace(
        "{0}", "{% for k, v in m['content'] %}{% endfor %}" + _PARTS
    ),
    "tuple-target-after-content-loop": _LOOP.replace(
        "{0}", _PARTS + "{% for k, v in m['content'] %}{% endfor %}"
    ),
    "does-not-parse": _LOOP.replace("{0}", "{% for p in m['content'] %}"),
}
