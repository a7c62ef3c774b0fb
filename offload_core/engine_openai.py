"""The OpenAI API of the simulated engine: request models, prompt -> token ids, and the
response / SSE chunk bodies, shaped like vLLM's so OpenAI clients and routers that speak
to vLLM speak to ``kvroute engine`` unchanged.

Generation is simulated: the prompt is prefilled for real (KV blocks, events), then
``max_tokens`` deterministic tokens are "decoded" (text only with a tokenizer), streamed
one chunk per token with an optional per-token delay.
"""

from __future__ import annotations

import hashlib
import time
import uuid
from collections.abc import Iterator
from typing import Annotated, Any

import msgspec
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr

MAX_TOKEN_ID = 2**31 - 1
IdList = Annotated[list[StrictInt], Field(min_length=1)]
Text = Annotated[StrictStr, Field(min_length=1)]


class StreamOptions(BaseModel):
    include_usage: bool = False


class _Common(BaseModel):
    """Fields shared by completions and chat; unknown fields are accepted and ignored."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None
    n: int = Field(default=1, ge=1, le=64)
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    lora_name: str | None = Field(default=None, max_length=256)
    cache_salt: str | None = Field(default=None, max_length=1024)

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class CompletionRequest(_Common):
    prompt: (
        IdList
        | Text
        | Annotated[list[IdList], Field(min_length=1)]
        | Annotated[list[Text], Field(min_length=1)]
    ) = Field(description="token ids, text (needs --tokenizer), or a batch of either")
    max_tokens: int = Field(default=1, ge=0, le=1_000_000)
    add_special_tokens: bool = True


class ChatRequest(_Common):
    messages: list[dict[str, Any]] = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=0, le=1_000_000)
    max_completion_tokens: int | None = Field(default=None, ge=0, le=1_000_000)
    add_generation_prompt: bool = True
    add_special_tokens: bool = False
    chat_template_kwargs: dict[str, Any] | None = None

    @property
    def output_tokens(self) -> int:
        for v in (self.max_completion_tokens, self.max_tokens):
            if v is not None:
                return v
        return 16


def prompts_of(body: CompletionRequest) -> list[list[int] | str]:
    p = body.prompt
    if isinstance(p, str):
        return [p]
    if p and isinstance(p[0], int):
        return [p]
    return list(p)  # type: ignore[arg-type]


def check_ids(ids: list[int]) -> None:
    if any(t < 0 or t > MAX_TOKEN_ID for t in ids):
        raise ValueError("prompt: token ids must be in [0, 2**31)")


def output_ids(prompt: list[int], n: int, vocab: int, first: int = 100) -> list[int]:
    """Deterministic "generated" token ids of one choice (seeded by the prompt)."""
    span = max(vocab - first, 1)
    seed = hashlib.blake2b(repr((prompt[-8:], len(prompt))).encode(), digest_size=8).digest()
    x = int.from_bytes(seed, "little")
    out = []
    for _ in range(n):
        x = (x * 6364136223846793005 + 1442695040888963407) % 2**64
        out.append(first + (x >> 33) % span)
    return out


class Builder:
    """Response bodies for one request (the ids and timestamps they share)."""

    def __init__(self, chat: bool, model: str) -> None:
        self.chat = chat
        self.model = model
        self.id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        self.created = int(time.time())

    def _choice(self, index: int, text: str, finish: str | None) -> dict[str, Any]:
        if self.chat:
            return {
                "index": index,
                "message": {"role": "assistant", "content": text},
                "logprobs": None,
                "finish_reason": finish,
            }
        return {"index": index, "text": text, "logprobs": None, "finish_reason": finish}

    def response(
        self, texts: list[str], usage: dict[str, Any], kv: dict[str, Any]
    ) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "chat.completion" if self.chat else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": [self._choice(i, t, "length") for i, t in enumerate(texts)],
            "usage": usage,
            "kv": kv,
        }

    def chunk(self, choices: list[dict[str, Any]], usage: Any = None) -> bytes:
        body: dict[str, Any] = {
            "id": self.id,
            "object": "chat.completion.chunk" if self.chat else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }
        if usage is not None:
            body["usage"] = usage
        return b"data: " + msgspec.json.encode(body) + b"\n\n"

    def delta(self, index: int, text: str | None, finish: str | None = None) -> dict[str, Any]:
        if self.chat:
            delta: dict[str, Any] = {} if text is None else {"content": text}
            return {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish}
        return {"index": index, "text": text or "", "logprobs": None, "finish_reason": finish}

    def stream_chunks(
        self, pieces: list[list[str]], usage: dict[str, Any] | None
    ) -> Iterator[bytes | None]:
        """SSE frames; ``None`` marks where one decode step ends (the app may pause)."""
        if self.chat:
            yield self.chunk(
                [
                    {**self.delta(i, ""), "delta": {"role": "assistant", "content": ""}}
                    for i in range(len(pieces))
                ]
            )
        steps = max((len(p) for p in pieces), default=0)
        for step in range(steps):
            yield None
            for i, p in enumerate(pieces):
                if step < len(p):
                    yield self.chunk([self.delta(i, p[step])])
        for i in range(len(pieces)):
            yield self.chunk([self.delta(i, None, "length")])
        if usage is not None:
            yield self.chunk([], usage)
        yield b"data: [DONE]\n\n"


def usage_of(prompt_tokens: int, completion_tokens: int, cached: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached},
    }
