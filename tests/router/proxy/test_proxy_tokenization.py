"""The proxy's tokenization: the shipped tokenizer, chat templates, prompt shapes."""

from __future__ import annotations

from pathlib import Path

import pytest

from router.proxy.tiny_tokenizer import DEFAULT_DIR, build
from schemas.tokenization import (
    ModelTokenizer,
    TokenizationError,
    TokenizerRegistry,
    completion_tokens,
)


def test_shipped_tokenizer_is_what_the_builder_writes(tmp_path: Path) -> None:
    build(tmp_path)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (tmp_path / name).read_bytes() == (DEFAULT_DIR / name).read_bytes(), name


def test_text_gets_bos_chat_gets_the_template_and_ids_pass_through() -> None:
    tok = ModelTokenizer(DEFAULT_DIR)
    assert tok.encode("kabe dodo") == [1, *tok.encode("kabe dodo", add_special_tokens=False)]
    ids = list(range(100, 8192, 13))
    assert tok.encode(tok.decode(ids), add_special_tokens=False) == ids  # demo relies on it
    body = {"messages": [{"role": "user", "content": [{"type": "text", "text": "kabe"}]}]}
    chat = tok.encode_chat(body)
    assert tok.decode(chat, skip_special_tokens=False) == "<s> <|user|> kabe <|end|> <|assistant|>"
    assert completion_tokens(tok, {"prompt": [5, 6, 7]}) == [5, 6, 7]
    assert completion_tokens(tok, {"prompt": ["kabe", "dodo"]}) == tok.encode("kabe")
    assert completion_tokens(None, {"prompt": "kabe"}) is None
    for bad in ({"prompt": []}, {"prompt": 3}, {}, {"prompt": [True]}):
        with pytest.raises(TokenizationError):
            completion_tokens(tok, bad)
    with pytest.raises(TokenizationError):
        tok.encode_chat({"messages": [{"role": "user", "content": 5}]})


def test_registry_fallback_and_bad_path() -> None:
    reg = TokenizerRegistry({"*": str(DEFAULT_DIR)})
    assert reg.get("any-model") is reg.get(None) is not None
    assert TokenizerRegistry({}).get("m") is None
    with pytest.raises(ValueError, match=r"no tokenizer\.json"):
        TokenizerRegistry({"m": "/nonexistent/tok"}).load_all()
