"""The context-length rules of vLLM 0.33's OpenAI server, for the simulated engine.

Why: a client or router that reads ``max_model_len`` from ``/v1/models`` (or sends a
prompt longer than the model takes) must see what vLLM answers. vLLM checks, in order
(``vllm/renderers/params.py`` ``TokenizeParams``, ``entrypoints/serve/utils/api_utils.py``
``get_max_tokens``, ``SamplingParams``):

1. an output limit above ``max_model_len`` is refused before tokenizing;
2. a prompt of more than ``max_model_len`` tokens is refused;
3. the output limit is clamped to what the context has left (no error: the answer ends
   with ``finish_reason: "length"``), and a prompt that leaves nothing is refused as
   ``max_tokens`` 0.

The messages carry vLLM's ``(parameter=..., value=...)`` tail, as its validation errors
print it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from offload_core.engine_errors import Reject

if TYPE_CHECKING:
    from offload_core.engine_openai import ChatRequest, CompletionRequest

# The simulated model's context when the operator sets none: larger than any prompt the
# benchmarks send, so the limit is off unless asked for (``--max-model-len``).
DEFAULT_MAX_MODEL_LEN = 1 << 20


def _output_limit(body: CompletionRequest | ChatRequest) -> tuple[int | None, str]:
    """The output limit vLLM checks against the context, and the field that set it."""
    limit = getattr(body, "max_completion_tokens", None)
    if limit is not None:
        return limit, "max_completion_tokens"
    if hasattr(body, "echo"):  # completions: an unset limit checks as 0
        return body.max_tokens or 0, "max_tokens"
    return body.max_tokens, "max_tokens"


def check_output_limit(body: CompletionRequest | ChatRequest, max_model_len: int) -> None:
    """Rule 1: ``Reject`` an output limit above the model's context."""
    limit, param = _output_limit(body)
    if limit is not None and limit > max_model_len:
        raise Reject(
            f"{param}={limit} cannot be greater than max_model_len={max_model_len}. "
            f"Please request fewer output tokens. (parameter={param}, value={limit})",
            param=param,
        )


def output_budget(
    body: CompletionRequest | ChatRequest, prompt_tokens: int, max_model_len: int
) -> int:
    """Rules 2 and 3: the tokens one choice of a ``prompt_tokens``-token prompt decodes,
    or ``Reject``."""
    if prompt_tokens > max_model_len:
        at_least = "at least " if prompt_tokens == max_model_len + 1 else ""
        raise Reject(
            f"This model's maximum context length is {max_model_len} tokens. However, "
            f"your prompt contains {at_least}{prompt_tokens} input tokens, which exceeds "
            "this limit even without any output tokens. Please reduce the length of the "
            f"input prompt. (parameter=input_tokens, value={prompt_tokens})",
            param="input_tokens",
        )
    wanted = body.output_tokens
    budget = min(wanted, max_model_len - prompt_tokens)
    echo_only = bool(getattr(body, "echo", False)) and wanted == 0
    if budget < 1 and not echo_only:
        raise Reject(f"max_tokens must be at least 1, got {budget}.")
    return budget
