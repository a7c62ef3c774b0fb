"""Prompt -> token ids the way the engine computes them, so the router scores what the
engine will look up in its prefix cache.

Like vLLM: a completion's text prompt is encoded with the tokenizer's special tokens
(the BOS its post-processor adds); a chat request is rendered with the model's chat
template (``tokenizer_config.json``, jinja2 in a sandbox, as ``transformers`` does) and
the rendered text is encoded without adding special tokens (the template writes them).
Token-id prompts pass through untouched. ``tokenizers`` + ``jinja2`` cost a fraction of
``transformers``' import time and no torch.

For chat, what vLLM 0.33's OpenAI server does between a request and its prompt token ids
is mirrored for text-only requests, one stage a module: ``request`` (the
``ChatCompletionRequest`` validators and ``OnlineRenderer.render_chat``'s checks),
``content_format`` (whether the template takes content as a string or as a list of parts),
``messages`` (message parsing, vllm/renderers/chat_utils/chat_message.py), ``tokenizer``
(``safe_apply_chat_template``, vllm/renderers/hf.py, and transformers 5's
``apply_chat_template`` under it) in ``template_env`` (transformers' jinja2 sandbox);
``loading`` reads the tokenizer directory, ``completions`` handles completion prompts,
``registry`` maps models to tokenizers. Held to recordings of vLLM's own code:
tests/fixtures/vllm-chat/recording.json.
"""

from schemas.tokenization.completions import completion_tokens
from schemas.tokenization.errors import NotTokenizable, TokenizationError
from schemas.tokenization.loading import resolve_tokenizer_path
from schemas.tokenization.messages import normalize_messages
from schemas.tokenization.registry import TokenizerRegistry
from schemas.tokenization.tokenizer import ModelTokenizer

__all__ = [
    "ModelTokenizer",
    "NotTokenizable",
    "TokenizationError",
    "TokenizerRegistry",
    "completion_tokens",
    "normalize_messages",
    "resolve_tokenizer_path",
]
