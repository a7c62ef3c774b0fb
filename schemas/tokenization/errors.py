"""The two ways a request fails to tokenize, apart so every stage (loading, messages,
request fields, the template's ``raise_exception``) can raise them and the proxy can tell
a 400 from a request it forwards untokenized, without importing the rest."""

from __future__ import annotations


class NotTokenizable(ValueError):
    """A valid request whose token ids the router cannot compute as the engine will
    (images, audio, prompt embeddings): it is forwarded unchanged and routed on load."""


class TokenizationError(ValueError):
    """The request's prompt or messages cannot be tokenized (a 400 for the client)."""
