"""Prompt -> token ids the way the engine computes them, so the router scores what the
engine will look up in its prefix cache.

Like vLLM: a completion's text prompt is encoded with the tokenizer's special tokens
(the BOS its post-processor adds); a chat request is rendered with the model's chat
template (``tokenizer_config.json``, jinja2 in a sandbox, as ``transformers`` does) and
the rendered text is encoded without adding special tokens (the template writes them).
Token-id prompts pass through untouched. ``tokenizers`` + ``jinja2`` cost a fraction of
``transformers``' import time and no torch.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Mapping, Sequence
from functools import cached_property
from pathlib import Path
from typing import Any


class NotTokenizable(ValueError):
    """A valid request whose token ids the router cannot compute as the engine will
    (images, audio, prompt embeddings): it is forwarded unchanged and routed on load."""


class TokenizationError(ValueError):
    """The request's prompt or messages cannot be tokenized (a 400 for the client)."""


def resolve_tokenizer_path(name: str) -> Path:
    """A local directory/file, or a Hugging Face id already in the local cache (never
    downloaded); ``FileNotFoundError`` when neither exists."""
    path = Path(name).expanduser()
    if path.is_file():
        return path.parent if path.name == "tokenizer.json" else path
    if (path / "tokenizer.json").is_file():
        return path
    hub = Path(
        os.environ.get("HF_HUB_CACHE")
        or Path(os.environ.get("HF_HOME", Path.home() / ".cache/huggingface")) / "hub"
    )
    snapshots = hub / ("models--" + name.replace("/", "--")) / "snapshots"
    if snapshots.is_dir():
        found = sorted(
            (p for p in snapshots.iterdir() if (p / "tokenizer.json").is_file()),
            key=lambda p: p.stat().st_mtime,
        )
        if found:
            return found[-1]
    raise FileNotFoundError(f"no tokenizer.json at {name!r} nor in the local HF cache ({hub})")


def _text_of(content: Any) -> str:
    """OpenAI message content: a string, or parts of which the text ones are joined."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            kind = part.get("type") if isinstance(part, Mapping) else None
            if not isinstance(kind, str):
                raise TokenizationError("a content part needs a string 'type'")
            if kind != "text":
                raise NotTokenizable(f"a {kind!r} content part")
            text = part.get("text")
            if not isinstance(text, str):
                raise TokenizationError("a text content part needs a string 'text'")
            texts.append(text)
        return "\n".join(texts)
    raise TokenizationError("message content must be a string or a list of parts")


def normalize_messages(messages: Any) -> list[dict[str, Any]]:
    if not isinstance(messages, list) or not messages:
        raise TokenizationError("'messages' must be a non-empty list")
    out = []
    for m in messages:
        if not isinstance(m, Mapping) or not isinstance(m.get("role"), str):
            raise TokenizationError("every message needs a string 'role'")
        out.append({**m, "content": _text_of(m.get("content"))})
    return out


class ModelTokenizer:
    """One model's tokenizer and chat template, loaded from ``path``."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        from tokenizers import Tokenizer

        self.path = resolve_tokenizer_path(str(path))
        self.tokenizer = Tokenizer.from_file(str(self.path / "tokenizer.json"))
        cfg_file = self.path / "tokenizer_config.json"
        self.config: dict[str, Any] = (
            json.loads(cfg_file.read_text(encoding="utf-8")) if cfg_file.is_file() else {}
        )
        template = self.config.get("chat_template")
        if isinstance(template, list):  # named templates: take the default one
            named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
            template = named.get("default")
        jinja_file = self.path / "chat_template.jinja"
        if template is None and jinja_file.is_file():
            template = jinja_file.read_text(encoding="utf-8")
        self.chat_template: str | None = template if isinstance(template, str) else None

    def _special(self, key: str) -> str:
        value = self.config.get(key)
        if isinstance(value, Mapping):
            value = value.get("content")
        return value if isinstance(value, str) else ""

    @cached_property
    def _template(self) -> Any:
        from jinja2.ext import loopcontrols
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message: str) -> None:
            raise TokenizationError(message)

        env = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols]
        )
        env.filters["tojson"] = lambda v, indent=None: json.dumps(v, indent=indent)
        env.globals["raise_exception"] = raise_exception
        return env.from_string(self.chat_template or "")

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
        """The chat template rendered as vLLM 0.33 renders it. ``add_generation_prompt`` is
        the request's own field; ``extra`` its ``chat_template_kwargs``, merged the way
        vLLM merges them (``_template_kwargs``). ``TokenizationError`` for any failure."""
        kwargs = self._template_kwargs(
            {"bos_token": self._special("bos_token"), "eos_token": self._special("eos_token")},
            extra,
        )
        if self.chat_template is None:
            raise TokenizationError(f"the tokenizer at {self.path} has no chat template")
        conversation = normalize_messages(messages)
        try:
            # A request's ``messages`` kwarg collides here, as in transformers' render.
            return str(
                self._template.render(
                    messages=conversation, add_generation_prompt=add_generation_prompt, **kwargs
                )
            )
        except TokenizationError:
            raise  # the template's raise_exception(): its own message
        except Exception as exc:  # vLLM answers 400 for any failure of the template call
            raise TokenizationError(f"chat template: {exc}") from exc

    @staticmethod
    def _template_kwargs(
        specials: Mapping[str, str], request: Mapping[str, Any] | None
    ) -> dict[str, Any]:
        """The template's variables besides ``messages`` and ``add_generation_prompt``, from
        the request's ``chat_template_kwargs`` as vLLM 0.33 builds them:

        - a value of None or "auto" is dropped (``merge_kwargs`` in vllm/renderers/params.py,
          applied to the request's kwargs by ``ChatParams.with_defaults``);
        - ``chat_template`` (any value but None) is refused, as
          ``OnlineRenderer.validate_chat_template`` refuses it without
          ``--trust-request-chat-template``; ``conversation`` collides with
          ``safe_apply_chat_template``'s own argument (vllm/renderers/hf.py), a TypeError
          vLLM answers with a 400; ``messages`` collides in the template call itself;
        - ``add_generation_prompt`` and ``continue_final_message``: the request's own
          fields win (``ChatCompletionRequest.build_chat_params``); those and transformers'
          other ``apply_chat_template`` arguments (``tokenize``, ``padding``...) never reach
          the template;
        - anything else is a template variable and wins over the defaults: the special
          tokens (transformers: "kwargs overwrite special tokens"), ``tools`` and
          ``documents`` (None, as transformers passes them, unless given).
        """
        given = {k: v for k, v in (request or {}).items() if v is not None and v != "auto"}
        if (request or {}).get("chat_template") is not None:
            raise TokenizationError(
                "Chat template is passed with request, but --trust-request-chat-template "
                "is not set. Refused request with untrusted chat template."
            )
        if "conversation" in given:
            raise TokenizationError(
                "chat_template_kwargs: 'conversation' collides with the request's messages"
            )
        consumed = (
            "add_generation_prompt",
            "continue_final_message",
            "tokenize",
            "sanitize_control_tokens",
            "padding",
            "truncation",
            "max_length",
            "return_tensors",
            "return_dict",
            "return_assistant_tokens_mask",
            "tokenizer_kwargs",
        )
        for key in consumed:
            given.pop(key, None)
        return {"tools": None, "documents": None, **specials, **given}

    def encode_chat(self, body: Mapping[str, Any]) -> list[int]:
        """Token ids of a chat request, as vLLM's OpenAI server builds them."""
        extra = body.get("chat_template_kwargs")
        text = self.render_chat(
            body.get("messages"),
            add_generation_prompt=bool(body.get("add_generation_prompt", True)),
            extra=extra if isinstance(extra, Mapping) else None,
        )
        return self.encode(text, add_special_tokens=bool(body.get("add_special_tokens", False)))


def _is_ids(value: Any) -> bool:
    # set(map(type, ...)) runs in C: ~20x faster than a generator on a long prompt, and
    # rejects bool (a subclass of int) like the generator did.
    return isinstance(value, list) and set(map(type, value)) <= {int}


def completion_tokens(tok: ModelTokenizer | None, body: Mapping[str, Any]) -> list[int] | None:
    """Token ids of a completion's (first) prompt; None when it is text and no tokenizer
    is configured. ``TokenizationError`` for a prompt of the wrong shape."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and not _is_ids(prompt):
        prompt = prompt[0]  # a batch of prompts: route on the first
    if _is_ids(prompt) and prompt:
        return list(prompt)
    if isinstance(prompt, str) and prompt:
        if tok is None:
            return None
        return tok.encode(prompt, add_special_tokens=bool(body.get("add_special_tokens", True)))
    if prompt in (None, "") and body.get("prompt_embeds") is not None:
        return None  # vLLM takes embeddings instead of a prompt: nothing to tokenize
    raise TokenizationError(
        "'prompt' must be a non-empty string, token-id list, or a list of those"
    )


class TokenizerRegistry:
    """Model name -> tokenizer, loaded on first use; ``*`` is the fallback for any model."""

    def __init__(self, paths: Mapping[str, str]) -> None:
        self.paths = dict(paths)
        self._loaded: dict[str, ModelTokenizer] = {}
        self._lock = threading.Lock()

    def load_all(self) -> None:
        """Load every configured tokenizer now, so a bad path fails at start-up."""
        for model, path in self.paths.items():
            try:
                self.get(model)
            except Exception as exc:  # tokenizers raises its own Exception types
                raise ValueError(f"tokenizer for {model!r} at {path!r}: {exc}") from exc

    def get(self, model: str | None) -> ModelTokenizer | None:
        key = model if model in self.paths else "*"
        tok = self._loaded.get(key)
        if tok is None and key in self.paths:
            with self._lock:
                tok = self._loaded.get(key)
                if tok is None:
                    tok = self._loaded[key] = ModelTokenizer(self.paths[key])
        return tok
