"""``ModelTokenizer``: one model's tokenizer and chat templates, and the template call
as vLLM's ``safe_apply_chat_template`` (vllm/renderers/hf.py) and transformers 5's
``apply_chat_template`` make it. The request's fields and messages are prepared in
``request`` / ``messages``; this module renders and encodes them."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from functools import cached_property
from typing import Any

from schemas.tokenization.content_format import ContentFormat, detect_content_format
from schemas.tokenization.errors import NotTokenizable, TokenizationError
from schemas.tokenization.loading import read_chat_templates, read_config, resolve_tokenizer_path
from schemas.tokenization.messages import _developer_as_system, _with_reasoning_aliases
from schemas.tokenization.request import parse_chat_request
from schemas.tokenization.template_env import _jinja_env

_SPECIAL_TOKENS = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)
_CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "
# safe_apply_chat_template's own arguments: a kwarg of the same name is a TypeError (400).
_RENDERER_ARGS = ("conversation", "model_config", "tokenizer")
# apply_chat_template's arguments that only matter when it tokenizes.
_TOKENIZER_ARGS = ("padding", "truncation", "max_length", "return_tensors", "tokenizer_kwargs")


class ModelTokenizer:
    """One model's tokenizer and chat template, loaded from ``path``."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        from tokenizers import Tokenizer

        self.path = resolve_tokenizer_path(str(path))
        self.tokenizer = Tokenizer.from_file(str(self.path / "tokenizer.json"))
        self.config: dict[str, Any] = read_config(self.path)
        # With several templates, a request with tools takes "tool_use" when there is one,
        # any other "default" (_template_for).
        self.chat_templates: dict[str, str]
        self.chat_template: str | None
        self.chat_templates, self.chat_template = read_chat_templates(self.path, self.config)
        self._compiled: dict[str, Any] = {}
        self._formats: dict[str, ContentFormat] = {}

    @cached_property
    def _env(self) -> Any:
        return _jinja_env()

    def special_tokens(self) -> dict[str, str]:
        """transformers' ``special_tokens_map``: the named special tokens that are set."""
        out = {}
        for key in _SPECIAL_TOKENS:
            value = self.config.get(key)
            if isinstance(value, Mapping):
                value = value.get("content")
            if isinstance(value, str):
                out[key] = value
        return out

    def _template_for(self, tools: Any) -> str:
        """transformers' ``get_chat_template`` for a request without its own template."""
        if self.chat_templates:
            if tools is not None and "tool_use" in self.chat_templates:
                return self.chat_templates["tool_use"]
            if "default" in self.chat_templates:
                return self.chat_templates["default"]
            raise TokenizationError(
                f"the tokenizer at {self.path} has several chat templates and no default: "
                f"{sorted(self.chat_templates)}"
            )
        if self.chat_template is None:
            raise TokenizationError(f"the tokenizer at {self.path} has no chat template")
        return self.chat_template

    def content_format(self, tools: Any = None) -> ContentFormat:
        """The content format of the template a request with template argument ``tools``
        renders with (vLLM's ``--chat-template-content-format auto``), once per template.
        "string" when no template resolves (the render then fails, as in vLLM)."""
        try:
            template = self._template_for(tools)
        except TokenizationError:
            return "string"
        fmt = self._formats.get(template)
        if fmt is None:
            fmt = self._formats[template] = detect_content_format(template, self._env)
        return fmt

    def _compile(self, template: str) -> Any:
        compiled = self._compiled.get(template)
        if compiled is None:
            try:
                compiled = self._compiled[template] = self._env.from_string(template)
            except Exception as exc:  # a template that does not parse: 400 in vLLM too
                raise TokenizationError(f"chat template: {exc}") from exc
        return compiled

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens))

    def render_chat(
        self,
        messages: Any,
        add_generation_prompt: bool = True,
        extra: Mapping[str, Any] | None = None,
    ) -> str:
        """The chat template rendered for ``messages``, the request's
        ``add_generation_prompt`` and ``chat_template_kwargs`` (``extra``), as vLLM 0.33
        renders it (``render_chat_request``)."""
        body = {
            "messages": messages,
            "add_generation_prompt": add_generation_prompt,
            "chat_template_kwargs": extra,
        }
        return self._prompt(body)[0]

    def render_chat_request(self, body: Mapping[str, Any]) -> str:
        """The prompt text vLLM 0.33's OpenAI server renders for a chat request ``body``.
        ``TokenizationError`` where vLLM answers 400, ``NotTokenizable`` where the prompt
        is more than text."""
        return self._prompt(body)[0]

    def encode_chat(self, body: Mapping[str, Any]) -> list[int]:
        """Token ids of a chat request, as vLLM 0.33's OpenAI server builds them."""
        text, add_special_tokens = self._prompt(body)
        return self.encode(text, add_special_tokens=add_special_tokens)

    def _prompt(self, body: Mapping[str, Any]) -> tuple[str, bool]:
        """(prompt text, whether the tokenizer adds its special tokens to it)."""
        conversation, kwargs, add_special_tokens = parse_chat_request(body, self.content_format)
        text = self._apply_chat_template(conversation, kwargs)
        if kwargs.get("tokenize"):  # transformers tokenized it: no special tokens added
            if any(kwargs.get(k) for k in _TOKENIZER_ARGS):
                raise NotTokenizable("chat_template_kwargs tokenize with tokenizer options")
            return text, False
        return text, add_special_tokens

    def _apply_chat_template(
        self, conversation: list[dict[str, Any]], kwargs: dict[str, Any]
    ) -> str:
        """vLLM's ``safe_apply_chat_template`` -> transformers' ``apply_chat_template``
        with ``tokenize`` off (the text; ``_prompt`` handles a kwarg that turns it on).
        Kwargs the template never reads are passed anyway (vLLM filters them out first:
        the render is the same)."""
        for name in _RENDERER_ARGS:
            if name in kwargs:
                raise TokenizationError(
                    f"chat_template_kwargs: {name!r} collides with the request's messages"
                    if name == "conversation"
                    else f"chat_template_kwargs: {name!r} collides with a renderer argument"
                )
        kwargs = dict(kwargs)
        tools = kwargs.pop("tools", None)
        tokenize = kwargs.pop("tokenize", False)
        documents = kwargs.pop("documents", None)
        add_generation_prompt = kwargs.pop("add_generation_prompt", False)
        continue_final = kwargs.pop("continue_final_message", False)
        if kwargs.pop("return_assistant_tokens_mask", False):
            raise TokenizationError(
                "`return_assistant_tokens_mask=True` requires `return_dict=True` and "
                "`tokenize=True`"
            )
        for name in ("return_dict", *_TOKENIZER_ARGS):
            kwargs.pop(name, None)
        template = self._template_for(tools)
        conversation = _developer_as_system(conversation, template)
        # transformers drops the keys whose value is None.
        chat = [{k: v for k, v in m.items() if v is not None} for m in conversation]
        if continue_final and add_generation_prompt:
            raise TokenizationError(
                "continue_final_message and add_generation_prompt are not compatible. Use "
                "continue_final_message when you want the model to continue the final message, "
                "and add_generation_prompt when you want to add a header that will prompt it to "
                "start a new assistant message instead."
            )
        if kwargs.pop("sanitize_control_tokens", False):
            if not tokenize:
                raise TokenizationError(
                    "`sanitize_control_tokens=True` requires `tokenize=True` and is not "
                    "compatible with `return_assistant_tokens_mask=True`."
                )
            raise NotTokenizable("chat_template_kwargs sanitize_control_tokens")
        template_kwargs = {**self.special_tokens(), **kwargs}  # kwargs win
        if tools is not None:
            try:
                tools = list(tools)
            except TypeError as exc:
                raise TokenizationError(f"chat template tools: {exc}") from None
            if not all(isinstance(t, dict) for t in tools):
                raise TokenizationError("chat template tools must be JSON schemas (objects)")
        if documents is not None:
            try:
                ok = all(isinstance(d, dict) for d in documents)
            except TypeError:
                ok = False
            if not ok:
                raise TokenizationError(
                    "Documents should be a list of dicts with 'title' and 'text' keys!"
                )
        chat = [_with_reasoning_aliases(m) for m in chat]
        final = ""
        if continue_final:
            if "content" not in template:
                raise TokenizationError(
                    'continue_final_message is set to "content" but this is not an accepted '
                    "field in the chat_template"
                )
            final, continued = _continued(chat[-1]["content"])
            chat[-1] = {**chat[-1], "content": continued}
        compiled = self._compile(template)
        try:
            text = str(
                compiled.render(
                    messages=chat,
                    tools=tools,
                    documents=documents,
                    add_generation_prompt=add_generation_prompt,
                    **template_kwargs,
                )
            )
        except (TokenizationError, NotTokenizable):
            raise  # the template's raise_exception(): its own message
        except Exception as exc:  # vLLM answers 400 for any failure of the template call
            raise TokenizationError(f"chat template: {exc}") from exc
        if continue_final:
            # Cut the render at the end of the final message, as transformers does.
            tag = _CONTINUE_TAG.strip()
            if final.strip() not in text or tag not in text:
                raise TokenizationError(
                    "continue_final_message is set but the final message does not appear in "
                    "the chat after applying the chat template"
                )
            at = text.rindex(tag)
            keeps_spacing = text[at : at + len(_CONTINUE_TAG)] == _CONTINUE_TAG
            text = text[:at] if keeps_spacing else text[:at].rstrip()
        return text


def _continued(content: str | list[dict[str, Any]]) -> tuple[str, Any]:
    """(the text the render must end in, the final message's content tagged where it
    ends), as transformers continues a final message: a string gets the tag; of a list of
    parts, the last one with a "text" does (there must be one)."""
    if isinstance(content, str):
        return content, content + _CONTINUE_TAG
    parts = list(content)
    for i in reversed(range(len(parts))):
        if "text" in parts[i]:
            text = parts[i]["text"]
            parts[i] = {**parts[i], "text": text + _CONTINUE_TAG}
            return text, parts
    raise TokenizationError(
        "continue_final_message is set but we could not find any text to continue in the "
        "final message!"
    )
