"""A chat request's ``messages`` as vLLM 0.33 hands them to the template
(vllm/renderers/chat_utils/chat_message.py): content as a string or as a list of parts,
as the template's content format asks (``content_format``), tool calls rebuilt, reasoning
kept; then what ``safe_apply_chat_template`` and transformers do to the conversation
(developer -> system, reasoning aliases). Apart from the request's other fields: the
conversation has its own shape and its own vLLM source, and the template call
(``tokenizer``) applies the last two steps once it knows the template."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from schemas.tokenization.content_format import ContentFormat
from schemas.tokenization.errors import NotTokenizable, TokenizationError

_TEXT_PARTS = {  # content part type -> the key holding its text
    "text": "text",
    "input_text": "text",
    "output_text": "text",
    "refusal": "refusal",
    "thinking": "thinking",
}
_MEDIA_PARTS = frozenset(
    {
        "image_url",
        "input_image",
        "image_embeds",
        "audio_embeds",
        "video_embeds",
        "prompt_embeds",
        "image_pil",
        "audio_url",
        "input_audio",
        "video_url",
    }
)
# Every field vLLM's content part types name; an "openai" template sees a text part's
# other fields (``cache_control``...) beside its "type" and "text".
_PART_FIELDS = frozenset(
    {
        *("type", "text", "refusal", "thinking", "closed", "name", "uuid", "data", "file"),
        *("image_url", "image_pil", "image_embeds", "audio_url", "audio_embeds"),
        *("input_audio", "video_url", "video_embeds", "prompt_cache_breakpoint"),
    }
)
_BILLING_HEADER = "x-anthropic-billing-header"
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


def _read_part(part: Any) -> tuple[str, str | None]:
    """One content part as vLLM's parser reads it: ("text", its text) for the text kinds,
    ("tool_reference", the tool's name or None); media parts are ``NotTokenizable``."""
    if isinstance(part, str):
        return "text", part
    if not isinstance(part, Mapping):
        raise TokenizationError("a content part must be an object or a string")
    kind = part.get("type")
    if kind is None or part.get("uuid") is not None:
        # vLLM infers the kind from the keys (a part with a uuid always takes this path).
        if _MEDIA_PARTS.intersection(part):
            raise NotTokenizable("a media content part")
        if "tool_reference" not in part:
            raise TokenizationError("Missing 'type' field in multimodal part.")
        kind = "tool_reference"
    if not isinstance(kind, str):
        raise TokenizationError("Invalid 'type' field in multimodal part.")
    if kind in _TEXT_PARTS:
        text = part.get(_TEXT_PARTS[kind])
        if not isinstance(text, str):
            raise TokenizationError(f"a {kind!r} content part needs a string {_TEXT_PARTS[kind]!r}")
        return "text", text
    if kind == "tool_reference":  # a deferred tool's name, passed through as text
        name = part.get("name")
        if name is not None and not isinstance(name, str):
            raise TokenizationError("a 'tool_reference' content part needs a string 'name'")
        return kind, name
    if kind in _MEDIA_PARTS:
        raise NotTokenizable(f"a {kind!r} content part")
    raise TokenizationError(f"Unsupported chat content part type: {kind!r}.")


def _without_billing_header(parts: list[Any]) -> list[Any]:
    """A system message's parts less the leading Claude Code ``x-anthropic-billing-header``
    line of each plain text part (vLLM drops it: its value changes on every request); a
    part that was only that line goes."""
    out = []
    for part in parts:
        plain = isinstance(part, str) or (isinstance(part, Mapping) and part.get("type") == "text")
        text = part if isinstance(part, str) else part.get("text") if plain else None
        if not (isinstance(text, str) and text.startswith(_BILLING_HEADER)):
            out.append(part)
            continue
        rest = text.partition("\n")[2]
        if rest:
            out.append(rest if isinstance(part, str) else {**part, "text": rest})
    return out


def _content(content: Any, role: str, content_format: ContentFormat) -> str | list[dict[str, Any]]:
    """A message's content as vLLM hands it to the template. For a "string" template: a
    string, or the non-empty texts of its parts joined with "\\n". For an "openai" one: a
    list of parts, a string being one part; text kinds become ``{"type": "text", "text",
    ...}`` keeping the fields vLLM's part types do not name (empty texts kept), a tool
    reference ``{"type": "tool_reference", "name"}``. Only an assistant (or function)
    message may have null content, which is no parts."""
    if content is None:
        if role not in ("assistant", "function"):
            raise TokenizationError(f"a {role!r} message's content must not be null")
        content = []
    parts = [content] if isinstance(content, str) else content
    if not isinstance(parts, list):
        raise TokenizationError("message content must be a string or a list of parts")
    if role == "system":
        parts = _without_billing_header(parts)
    texts: list[str] = []
    wrapped: list[dict[str, Any]] = []
    for part in parts:
        kind, text = _read_part(part)
        if content_format == "string":
            if text:
                texts.append(text)
        elif kind == "tool_reference":
            wrapped.append({"type": kind, "name": text})
        else:
            extra = {} if isinstance(part, str) else part
            kept = {k: v for k, v in extra.items() if k not in _PART_FIELDS}
            wrapped.append({"type": "text", "text": text, **kept})
    return "\n".join(texts) if content_format == "string" else wrapped


def _all_text(parts: list[dict[str, Any]]) -> bool:
    """Whether a tool message's parts are all text (vLLM then makes them one string)."""
    return all(part["type"] == "text" for part in parts)


def _arguments(arguments: str) -> dict[str, Any]:
    """A tool call's JSON arguments as the object templates expect; vLLM coerces empty,
    malformed and non-object arguments to {} rather than fail the conversation."""
    if not arguments:
        return {}
    try:
        parsed = json.loads(arguments)
    except ValueError:
        return {}
    except RecursionError:  # vLLM fails with a 500
        raise TokenizationError("tool call arguments nest too deeply") from None
    return parsed if isinstance(parsed, dict) else {}


def _tool_calls(calls: Any) -> list[dict[str, Any]]:
    """An assistant message's ``tool_calls`` as the template sees them: each one rebuilt in
    the field order pydantic gives it (``id``, ``function`` {``arguments``, ``name``, any
    other keys}, ``type``, any other keys), its arguments parsed. An empty list is none."""
    if calls is None:
        return []
    if not isinstance(calls, list):
        raise TokenizationError("an assistant message's 'tool_calls' must be a list")
    out = []
    for call in calls:
        if not isinstance(call, Mapping):
            raise TokenizationError("assistant tool_calls entries must be objects.")
        if call.get("type") != "function":
            raise TokenizationError(
                "chat completions only support assistant tool_calls of type 'function'."
            )
        fn = call.get("function")
        if not (
            isinstance(call.get("id"), str)
            and isinstance(fn, Mapping)
            and isinstance(fn.get("name"), str)
            and isinstance(fn.get("arguments"), str)
        ):
            raise TokenizationError(
                "a tool call needs a string 'id' and a 'function' with string 'name' and "
                "'arguments'"
            )
        function = {"arguments": _arguments(fn["arguments"]), "name": fn["name"]}
        function.update((k, v) for k, v in fn.items() if k not in function)
        rebuilt = {"id": call["id"], "function": function, "type": "function"}
        rebuilt.update((k, v) for k, v in call.items() if k not in rebuilt)
        out.append(rebuilt)
    return out


def normalize_messages(
    messages: Any, content_format: ContentFormat = "string"
) -> list[dict[str, Any]]:
    """The conversation vLLM 0.33 builds from a request's ``messages`` for a template of
    ``content_format`` (``parse_chat_messages``): every message is rebuilt from its
    ``role`` and content (``_content``), plus, where given, an assistant's ``tool_calls``
    and reasoning (``reasoning``, else the older ``reasoning_content``; the template gets
    both names), a tool message's ``tool_call_id``, a string ``name`` or ``task``, and a
    developer message's ``tools``. Any other field is dropped. A message without content
    has none ("" or no parts). A tool message's parts, when all are text, are one string
    (their texts joined with "\\n", empty ones too): most templates print a tool result
    as a string."""
    if not isinstance(messages, list):
        raise TokenizationError("'messages' must be a list of messages")
    if not messages:
        raise TokenizationError(
            "Cannot apply chat template to an empty conversation. Provide at least one message."
        )
    out = []
    for m in messages:
        if not isinstance(m, Mapping) or not isinstance(m.get("role"), str):
            raise TokenizationError("every message needs a string 'role'")
        role = m["role"]
        content = _content(m.get("content", []), role, content_format)
        if role == "tool" and isinstance(content, list) and _all_text(content):
            content = "\n".join(part["text"] for part in content)
        msg: dict[str, Any] = {"role": role, "content": content}
        if role == "assistant":
            calls = _tool_calls(m.get("tool_calls"))
            if calls:
                msg["tool_calls"] = calls
            reasoning = m.get("reasoning")
            if reasoning is None:
                reasoning = m.get("reasoning_content")
            if isinstance(reasoning, Mapping) and reasoning.get("type") == "prompt_embeds":
                raise NotTokenizable("reasoning given as prompt embeddings")
            if reasoning is not None:  # passed on as sent, whatever its type
                msg["reasoning"] = msg["reasoning_content"] = reasoning
        elif role == "tool" and "tool_call_id" in m:
            if not isinstance(m["tool_call_id"], (str, type(None))):
                raise TokenizationError("a tool message's 'tool_call_id' must be a string")
            msg["tool_call_id"] = m["tool_call_id"]
        if isinstance(m.get("name"), str):
            msg["name"] = m["name"]
        elif "name" in m and not (role == "tool" and isinstance(m.get("tool_call_id"), str)):
            # Only a tool message (with an id) may carry another name, which is dropped.
            raise TokenizationError("a message's 'name' must be a string")
        if isinstance(m.get("task"), str):
            msg["task"] = m["task"]
        if role == "developer":
            msg["tools"] = m.get("tools")
        out.append(msg)
    return out


def _developer_as_system(conversation: list[dict[str, Any]], template: str) -> list[dict[str, Any]]:
    """vLLM's ``safe_apply_chat_template`` for a template that never names the
    "developer" role: developer messages become system ones (without their ``tools``), and
    then all system messages merge into one, first, their non-empty contents joined with a
    blank line - unless there is just one and it is already first. A content given as
    parts counts as their texts joined with "\\n" (the merged content is a string)."""
    if not any(m["role"] == "developer" for m in conversation):
        return conversation
    if '"developer"' in template or "'developer'" in template:
        return conversation
    converted = []
    for m in conversation:
        if m["role"] == "developer":
            m = {**m, "role": "system"}
            m.pop("tools", None)
        converted.append(m)
    contents: list[str] = []
    others = []
    merge = False
    for i, m in enumerate(converted):
        if m["role"] != "system":
            others.append(m)
            continue
        merge = merge or i > 0 or bool(contents)
        content = m["content"]
        if isinstance(content, list):
            content = "\n".join(part["text"] for part in content if "text" in part)
        if content:
            contents.append(content)
    if not merge:
        return converted
    return [{"role": "system", "content": "\n\n".join(contents)}, *others]


def _with_reasoning_aliases(message: dict[str, Any]) -> dict[str, Any]:
    """transformers passes a message's reasoning under every name templates read it by:
    ``thinking`` (first) and ``reasoning_content`` (in place, or last)."""
    reasoning = next((message[k] for k in _REASONING_FIELDS if message.get(k) is not None), None)
    if reasoning is None:
        return message
    return {"thinking": reasoning, **message, "reasoning_content": reasoning}
