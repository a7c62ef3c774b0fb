"""The OpenAI API of the simulated engine: request models, prompt -> token ids, and the
response / SSE chunk bodies, shaped like vLLM 0.33's (``vllm/entrypoints/openai/``) so
OpenAI clients and routers that speak to vLLM speak to ``kvroute engine`` unchanged.

Generation is simulated: the prompt is prefilled for real (KV blocks, events), then
``max_tokens`` deterministic tokens are "decoded" (text only with a tokenizer), streamed
one chunk per token with an optional per-token delay. ``logprobs`` have vLLM's shape: the
sampled token is rank 1 with logprob 0.0, the other candidates -9999.0.
"""

from __future__ import annotations

import hashlib
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Annotated, Any

import msgspec
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr

from offload_core.engine_stop import LENGTH, StopRule

MAX_TOKEN_ID = 2**31 - 1
MAX_LOGPROBS = 20  # vLLM's default --max-logprobs
IdList = Annotated[list[StrictInt], Field(min_length=1)]
Text = Annotated[StrictStr, Field(min_length=1)]
Entry = tuple[str, float | None, list[tuple[str, float]] | None]  # token, logprob, top


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")

    include_usage: bool | None = False
    continuous_usage_stats: bool | None = False


class _Common(BaseModel):
    """Fields shared by completions and chat; unknown fields are accepted and ignored."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None
    n: int = Field(default=1, ge=1, le=64)
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    lora_name: str | None = Field(default=None, max_length=256)
    cache_salt: str | None = None  # vLLM's rules in refusal()
    return_tokens_as_token_ids: bool | None = None
    stop: str | list[str] | None = None  # offload_core.engine_stop
    stop_token_ids: list[StrictInt] | None = None
    include_stop_str_in_output: bool = False

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and bool(self.stream_options.include_usage)

    @property
    def continuous_usage(self) -> bool:
        so = self.stream_options
        return self.include_usage and so is not None and bool(so.continuous_usage_stats)


class CompletionRequest(_Common):
    prompt: (
        IdList
        | Text
        | Annotated[list[IdList], Field(min_length=1)]
        | Annotated[list[Text], Field(min_length=1)]
    ) = Field(description="token ids, text (needs --tokenizer), or a batch of either")
    max_tokens: int | None = Field(default=1, le=1_000_000)
    echo: bool | None = False
    logprobs: int | None = None
    add_special_tokens: bool = True

    @property
    def output_tokens(self) -> int:
        return 1 if self.max_tokens is None else self.max_tokens


class ChatRequest(_Common):
    messages: list[dict[str, Any]] = Field(min_length=1)
    max_tokens: int | None = Field(default=None, le=1_000_000)
    max_completion_tokens: int | None = Field(default=None, le=1_000_000)
    logprobs: bool | None = False
    top_logprobs: int | None = 0
    add_generation_prompt: bool = True
    add_special_tokens: bool = False
    chat_template_kwargs: dict[str, Any] | None = None

    @property
    def output_tokens(self) -> int:
        for v in (self.max_completion_tokens, self.max_tokens):
            if v is not None:
                return v
        return 16


_SALT_FORBIDDEN = frozenset("@/\\\x00")


def refusal(body: CompletionRequest | ChatRequest, vocab: int) -> str | None:
    """The message of the 400 vLLM 0.33 answers for this request (its protocol models'
    validators and ``SamplingParams``), or None."""
    so = body.stream_options
    if so is not None and so.model_dump(exclude_unset=True) and not body.stream:
        return "Stream options can only be defined when `stream=True`."
    stop = StopRule.of(body).refusal()
    if stop is not None:
        return stop
    salt = body.cache_salt
    if salt is not None and not salt:
        return "Parameter 'cache_salt' must be a non-empty string if provided."
    if salt is not None and (len(salt) > 128 or any(c in _SALT_FORBIDDEN for c in salt)):
        return (
            "Parameter 'cache_salt' must be at most 128 characters and must not contain "
            "'@', '/', '\\\\', or NUL."
        )
    if isinstance(body, ChatRequest):
        top, name, asked = body.top_logprobs or 0, "top_logprobs", bool(body.logprobs)
        if (top == -1 or top > 0) and not asked:
            return "when using `top_logprobs`, `logprobs` must be set to true."
    else:
        top, name, asked = body.logprobs or 0, "logprobs", body.logprobs is not None
    if top < -1:
        return f"`{name}` must be a positive value or -1."
    if asked and (top == -1 or top > MAX_LOGPROBS):
        wanted = vocab if top == -1 else top
        return f"Requested sample logprobs of {wanted}, which is greater than max allowed: 20"
    out = body.output_tokens
    echo_only = isinstance(body, CompletionRequest) and bool(body.echo) and out == 0
    if out < 1 and not echo_only:
        return f"max_tokens must be at least 1, got {out}."
    return None


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


FIRST_OUTPUT_ID = 100


def output_ids(prompt: list[int], n: int, vocab: int, first: int = FIRST_OUTPUT_ID) -> list[int]:
    """Deterministic "generated" token ids of one choice (seeded by the prompt)."""
    span = max(vocab - first, 1)
    seed = hashlib.blake2b(repr((prompt[-8:], len(prompt))).encode(), digest_size=8).digest()
    x = int.from_bytes(seed, "little")
    out = []
    for _ in range(n):
        x = (x * 6364136223846793005 + 1442695040888963407) % 2**64
        out.append(first + (x >> 33) % span)
    return out


@dataclass(slots=True)
class Step:
    """One streamed delta of one choice: its text, output tokens and logprob entries."""

    text: str
    tokens: int
    entries: list[Entry]


class Builder:
    """Response bodies for one request (the ids, timestamps and options they share).
    ``top``: logprob candidates asked for (completions ``logprobs``, chat
    ``top_logprobs``), None when no logprobs are wanted."""

    def __init__(
        self,
        chat: bool,
        model: str,
        tokenizer: Any = None,
        *,
        vocab: int = 32_000,
        top: int | None = None,
        as_ids: bool = False,
    ) -> None:
        self.chat, self.model, self.tok, self.vocab = chat, model, tokenizer, vocab
        self.top, self.as_ids = top, as_ids
        self.id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        # Per choice, how it finished where a stop rule ended it (else by length).
        self.ends: dict[int, dict[str, Any]] = {}
        self.created = int(time.time())

    @classmethod
    def of(cls, body: CompletionRequest | ChatRequest, model: str, tok: Any, vocab: int) -> Builder:
        if isinstance(body, ChatRequest):
            top = (body.top_logprobs or 0) if body.logprobs else None
        else:
            top = body.logprobs
        as_ids = bool(body.return_tokens_as_token_ids)
        return cls(isinstance(body, ChatRequest), model, tok, vocab=vocab, top=top, as_ids=as_ids)

    def _word(self, t: int, prompt: bool = False) -> str:
        if self.as_ids or self.tok is None:
            return f"token_id:{t}"
        if prompt:
            return str(self.tok.decode([t], skip_special_tokens=False))
        return self.tok.decode([t]) + " "

    def _entry(self, t: int, prompt: bool = False, first: bool = False) -> Entry:
        word = self._word(t, prompt)
        if first:  # a prompt's first token has no logprob
            return word, None, None
        k = self.top or 0
        count = k if self.chat else max(k, 1)
        span = max(self.vocab - FIRST_OUTPUT_ID, 1)
        alts = [FIRST_OUTPUT_ID + (t - FIRST_OUTPUT_ID + j) % span for j in range(1, count)]
        return word, 0.0, [(word, 0.0)][:count] + [(self._word(a, prompt), -9999.0) for a in alts]

    def texts(self, gen: list[int]) -> list[str]:
        """Each generated token's text (none without a tokenizer)."""
        return [self.tok.decode([t]) + " " if self.tok is not None else "" for t in gen]

    def steps(
        self,
        gen: list[int],
        echo: tuple[str, list[int]] | None = None,
        text: list[str] | None = None,
    ) -> list[Step]:
        """One step per generated token (``text``: each one's, if not its own); ``echo``
        (prompt text, ids) leads the first."""
        lp = self.top is not None
        text = self.texts(gen) if text is None else text
        out = [Step(s, 1, [self._entry(t)] if lp else []) for s, t in zip(text, gen, strict=True)]
        if echo is not None:
            ids = echo[1]
            entries = [self._entry(t, True, j == 0) for j, t in enumerate(ids)] if lp else []
            if out:
                out[0] = Step(echo[0] + out[0].text, 1, entries + out[0].entries)
            else:
                out = [Step(echo[0], 0, entries)]
        return out

    def _logprobs(self, entries: list[Entry], offset: int) -> tuple[Any, int]:
        """vLLM's logprobs body for ``entries`` and the text offset after them."""
        if self.top is None:
            return None, offset
        if self.chat:

            def cand(tok: str, lp: float) -> dict[str, Any]:
                return {"token": tok, "logprob": lp, "bytes": list(tok.encode())}

            content = [
                {
                    **cand(w, -9999.0 if lp is None else lp),
                    "top_logprobs": [cand(*c) for c in top or []],
                }
                for w, lp, top in entries
            ]
            return {"content": content}, offset
        offsets = []
        for word, _, _ in entries:
            offsets.append(offset)
            offset += len(word)
        body = {
            "text_offset": offsets,
            "token_logprobs": [lp for _, lp, _ in entries],
            "tokens": [w for w, _, _ in entries],
            "top_logprobs": [None if top is None else dict(top) for _, _, top in entries],
        }
        return body, offset

    def _choice(self, index: int, steps: list[Step]) -> dict[str, Any]:
        text = "".join(s.text for s in steps)
        lp, _ = self._logprobs([e for s in steps for e in s.entries], 0)
        if self.chat:
            message = {"role": "assistant", "content": text}
            return {"index": index, "message": message, "logprobs": lp, **self.end(index)}
        return {"index": index, "text": text, "logprobs": lp, **self.end(index)}

    def end(self, index: int) -> dict[str, Any]:
        return self.ends.get(index, LENGTH)

    def response(
        self, choices: list[list[Step]], usage: dict[str, Any], kv: dict[str, Any]
    ) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "chat.completion" if self.chat else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": [self._choice(i, steps) for i, steps in enumerate(choices)],
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

    def delta(self, index: int, text: str | None, lp: Any = None, last: bool = False) -> Any:
        """One choice of a chunk; the last one of a choice carries its finish reason."""
        end = self.end(index) if last else {"finish_reason": None}
        if self.chat:
            delta: dict[str, Any] = {} if text is None else {"content": text}
            return {"index": index, "delta": delta, "logprobs": lp, **end}
        return {"index": index, "text": text or "", "logprobs": lp, "stop_reason": None, **end}

    def stream_chunks(
        self,
        choices: list[list[Step]],
        prompt_tokens: list[int],
        usage: dict[str, Any] | None,
        continuous: bool = False,
    ) -> Iterator[bytes | None]:
        """SSE frames as vLLM sends them: chat opens with one role chunk per choice, the
        last token's chunk carries ``finish_reason``, then the usage chunk (with
        ``include_usage``; ``continuous_usage_stats`` adds usage to every chunk) and
        ``[DONE]``. ``None`` marks where one decode step ends (the app may pause)."""

        def use(i: int, done: int) -> dict[str, int] | None:
            if not continuous:
                return None
            p = prompt_tokens[i]
            return {"prompt_tokens": p, "completion_tokens": done, "total_tokens": p + done}

        if self.chat:
            for i in range(len(choices)):
                role = {"index": i, "delta": {"role": "assistant", "content": ""}}
                yield self.chunk([{**role, "logprobs": None, "finish_reason": None}], use(i, 0))
        for i, steps in enumerate(choices):
            if not steps:  # nothing to send: the choice ends at once
                yield self.chunk([self.delta(i, None, None, True)], use(i, 0))
        done, offsets = [0] * len(choices), [0] * len(choices)
        for s in range(max((len(c) for c in choices), default=0)):
            yield None
            for i, steps in enumerate(choices):
                if s < len(steps):
                    done[i] += steps[s].tokens
                    lp, offsets[i] = self._logprobs(steps[s].entries, offsets[i])
                    last = s == len(steps) - 1
                    yield self.chunk([self.delta(i, steps[s].text, lp, last)], use(i, done[i]))
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
