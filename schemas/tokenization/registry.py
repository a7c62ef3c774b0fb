"""Which tokenizer serves which model: each loaded once, on first use or at start-up, and
shared across threads. Not in ``loading``: ``ModelTokenizer`` imports ``loading`` and the
registry builds ``ModelTokenizer``s, so together they would import each other."""

from __future__ import annotations

import threading
from collections.abc import Mapping

from schemas.tokenization.tokenizer import ModelTokenizer


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
