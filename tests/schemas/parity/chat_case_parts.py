"""The pieces the recorded chat cases share (a short conversation, two tools, documents, a
tool-calling turn) and ``case``, which makes one named request body. Apart so the case
lists (chat_cases.py, chat_cases_tools.py) can share them without importing each other."""

from __future__ import annotations

from typing import Any

HI = [{"role": "user", "content": "baba babe"}]
WEATHER = {
    "type": "function",
    "function": {
        "name": "gaga",
        "description": "gage gagi",
        "parameters": {
            "type": "object",
            "properties": {"gago": {"type": "string", "description": "gagu"}},
            "required": ["gago"],
        },
    },
}
CLOCK = {"type": "function", "function": {"name": "haha"}}
DOCS = [{"title": "jaja", "text": "jaje jaji"}, {"text": "jajo", "title": "jaju", "url": "kaka"}]
TOOL_TURN = [
    {"role": "user", "content": "baba"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call1",
                "type": "function",
                "function": {"name": "gaga", "arguments": '{"gago": "lala"}'},
            },
            {
                "type": "function",
                "function": {"arguments": "not json", "name": "haha"},
                "id": "call2",
            },
            {"id": "call3", "type": "function", "function": {"name": "haha", "arguments": ""}},
            {"id": "call4", "type": "function", "function": {"name": "haha", "arguments": "[1]"}},
        ],
    },
    {"role": "tool", "tool_call_id": "call1", "content": "lale"},
    {
        "role": "tool",
        "tool_call_id": "call2",
        "name": "haha",
        "content": [{"type": "text", "text": "lali"}, {"type": "text", "text": "lalo"}],
    },
    {"role": "user", "content": "babi"},
]


def case(name: str, tokenizer: str, **body: Any) -> dict[str, Any]:
    body.setdefault("messages", HI)
    return {"name": name, "tokenizer": tokenizer, "body": {"model": "m", **body}}
