"""A chat request's own fields, as vLLM 0.33's ``ChatCompletionRequest`` validates them
(vllm/entrypoints/openai/chat_completion/protocol.py) and ``OnlineRenderer.render_chat``
checks them (vllm/renderers/online_renderer.py): booleans, ``tools`` / ``tool_choice``,
``documents``, ``reasoning_effort``, refused request templates, and the merge of all of
them with ``chat_template_kwargs`` into the template's arguments. Apart from the
messages and from the template call: this is the request model, not the rendering."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from schemas.tokenization.content_format import ContentFormat
from schemas.tokenization.errors import TokenizationError
from schemas.tokenization.messages import normalize_messages

_REASONING_EFFORTS = frozenset({"none", "minimal", "low", "medium", "high", "xhigh", "max"})
_UNSET = (None, "auto")  # vLLM's merge_kwargs drops these values
_TRUE = frozenset({"1", "on", "t", "true", "y", "yes"})
_FALSE = frozenset({"0", "off", "f", "false", "n", "no"})
_UNTRUSTED_TEMPLATE = (
    "Chat template is passed with request, but --trust-request-chat-template is not set. "
    "Refused request with untrusted chat template."
)


def _lax_bool(value: Any, field: str) -> bool:
    """A pydantic ``bool`` field in lax mode: a bool, 0/1, or one of the strings
    1/0, on/off, t/f, true/false, y/n, yes/no in any case."""
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        if value.lower() in _TRUE:
            return True
        if value.lower() in _FALSE:
            return False
    raise TokenizationError(f"'{field}' must be a boolean")


def _optional_bool(value: Any, field: str) -> bool | None:
    return None if value is None else _lax_bool(value, field)


def _merge(defaults: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """vLLM's ``merge_kwargs``: ``overrides`` win, except their None and "auto" values."""
    return {**defaults, **{k: v for k, v in overrides.items() if v not in _UNSET}}


def _tool_dict(tool: Any) -> dict[str, Any]:
    """One of the request's ``tools`` as vLLM hands it to the template:
    ``ChatCompletionToolsParam.model_dump()`` - ``type``, then ``function`` with ``name``,
    ``description`` and ``parameters`` (null when not given), ``strict`` and
    ``defer_loading`` only when set (a tool-level ``defer_loading`` fills the function's),
    then the tool-level ``defer_loading`` when set; any other key is dropped."""
    if not isinstance(tool, Mapping):
        raise TokenizationError("every tool must be an object")
    if tool.get("type", "function") != "function":
        raise TokenizationError("a tool's 'type' must be 'function'")
    fn = tool.get("function")
    if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
        raise TokenizationError("a tool needs a 'function' with a string 'name'")
    description = fn.get("description")
    if description is not None and not isinstance(description, str):
        raise TokenizationError("a tool's 'description' must be a string")
    parameters = fn.get("parameters")
    if parameters is not None and not isinstance(parameters, Mapping):
        raise TokenizationError("a tool's 'parameters' must be an object")
    strict = _optional_bool(fn.get("strict"), "strict")
    tool_defer = _optional_bool(tool.get("defer_loading"), "defer_loading")
    defer = _optional_bool(fn.get("defer_loading"), "defer_loading")
    if defer is None:
        defer = tool_defer
    function: dict[str, Any] = {
        "name": fn["name"],
        "description": description,
        "parameters": parameters,
    }
    if strict is not None:
        function["strict"] = strict
    if defer is not None:
        function["defer_loading"] = defer
    out: dict[str, Any] = {"type": "function", "function": function}
    if tool_defer is not None:
        out["defer_loading"] = tool_defer
    return out


def _tool_dicts(body: Mapping[str, Any]) -> list[dict[str, Any]] | None:
    """The request's ``tools`` for the template, after vLLM's ``check_tool_usage``. They
    are kept whatever ``tool_choice`` says: vLLM drops them for "none" only with
    ``--exclude-tools-when-tool-choice-none`` (off by default)."""
    tools = body.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise TokenizationError("'tools' must be a list")
    if tools == []:
        raise TokenizationError(
            "`tools` must not be an empty array. "
            "Either provide at least one tool or omit the field entirely."
        )
    dicts = None if tools is None else [_tool_dict(tool) for tool in tools]
    choice = body.get("tool_choice")
    if choice is None or choice == "none":
        return dicts
    if dicts is None:
        raise TokenizationError("When using `tool_choice`, `tools` must be set.")
    if choice in ("auto", "required"):
        return dicts
    if not isinstance(choice, Mapping):
        raise TokenizationError(
            f"Invalid value for `tool_choice`: {choice}! "
            'Only named tools, "none", "auto" or "required" are supported.'
        )
    function = choice.get("function")
    name = function.get("name") if isinstance(function, Mapping) else None
    if not isinstance(name, str) or not name or choice.get("type", "function") != "function":
        raise TokenizationError(
            'a named `tool_choice` is `{"type": "function", "function": {"name": "my_function"}}`'
        )
    if all(d["function"]["name"] != name for d in dicts):
        raise TokenizationError(
            "The tool specified in `tool_choice` does not match any of the specified `tools`"
        )
    return dicts


def _documents(documents: Any) -> list[dict[str, str]] | None:
    if documents is None:
        return None
    if not isinstance(documents, list) or not all(
        isinstance(d, Mapping) and all(isinstance(v, str) for v in d.values()) for d in documents
    ):
        raise TokenizationError("'documents' must be a list of objects with string values")
    return documents


def _template_kwargs(
    user: Mapping[str, Any], fields: Mapping[str, Any], tools: list[dict[str, Any]] | None
) -> dict[str, Any]:
    """The arguments vLLM passes ``safe_apply_chat_template`` besides the conversation
    (``ChatCompletionRequest.build_chat_params`` -> ``ChatParams.with_defaults`` ->
    ``get_apply_chat_template_kwargs``), from the request's ``chat_template_kwargs``
    (``user``), its own template fields (``fields``) and its ``tools``:

    - the request's fields win over the kwargs: ``add_generation_prompt``,
      ``continue_final_message``, and ``documents`` and ``reasoning_effort`` when set;
    - ``enable_thinking`` = (``reasoning_effort`` != "none") when the request sets
      ``reasoning_effort`` and its kwargs do not name ``enable_thinking`` (naming it
      with null or "auto" leaves it unset);
    - under those, the defaults: ``tools`` (the request's) and ``tokenize`` = False; a
      kwarg ``tools`` replaces the request's tools, as sent;
    - a value of None or "auto" is no value (``merge_kwargs``); ``return_dict`` is False.
    """
    extra = dict(fields)
    effort = fields.get("reasoning_effort")
    if effort is not None and "enable_thinking" not in user:
        extra["enable_thinking"] = effort != "none"
    chat_params = {**user, **{k: v for k, v in extra.items() if v not in _UNSET}}
    defaults = {"tools": tools, "tokenize": False} if tools is not None else {"tokenize": False}
    return {**_merge(defaults, chat_params), "return_dict": False}


def parse_chat_request(
    body: Mapping[str, Any],
    content_format: Callable[[Any], ContentFormat] | None = None,
) -> tuple[list[dict[str, Any]], dict[str, Any], bool]:
    """(the conversation, the template's arguments, the request's ``add_special_tokens``)
    for a chat request ``body``; ``TokenizationError`` where vLLM refuses it. The messages
    take the content format ``content_format`` gives for the template's ``tools`` argument
    (it picks the template, as in vLLM); without it, "string"."""
    if not isinstance(body, Mapping):
        raise TokenizationError("the request body must be an object")
    # ChatCompletionRequest's field types and validators.
    user = body.get("chat_template_kwargs")
    if user is not None and not isinstance(user, Mapping):
        raise TokenizationError("'chat_template_kwargs' must be an object")
    if body.get("continue_final_message") and body.get("add_generation_prompt"):
        raise TokenizationError(
            "Cannot set both `continue_final_message` and `add_generation_prompt` to True."
        )
    fields = {
        "add_generation_prompt": _lax_bool(
            body.get("add_generation_prompt", True), "add_generation_prompt"
        ),
        "continue_final_message": _lax_bool(
            body.get("continue_final_message", False), "continue_final_message"
        ),
        "documents": _documents(body.get("documents")),
        "reasoning_effort": body.get("reasoning_effort"),
    }
    add_special_tokens = _lax_bool(body.get("add_special_tokens", False), "add_special_tokens")
    if fields["reasoning_effort"] not in (None, *_REASONING_EFFORTS):
        raise TokenizationError(
            f"'reasoning_effort' must be one of {sorted(_REASONING_EFFORTS)} or null"
        )
    tools = _tool_dicts(body)
    chat_template = body.get("chat_template")
    if chat_template is not None and not isinstance(chat_template, str):
        raise TokenizationError("'chat_template' must be a string")
    # OnlineRenderer.validate_chat_template (no --trust-request-chat-template).
    if chat_template is not None or (user or {}).get("chat_template") is not None:
        raise TokenizationError(_UNTRUSTED_TEMPLATE)
    kwargs = _template_kwargs(user or {}, fields, tools)
    fmt = "string" if content_format is None else content_format(kwargs.get("tools"))
    conversation = normalize_messages(body.get("messages"), fmt)
    return conversation, kwargs, add_special_tokens
