"""``usage.prompt_tokens_details.cached_tokens`` of an engine's answer: how many prompt
tokens the engine found cached. The proxy compares it with the router's estimate, and
prefix warming reads it to see whether the last warming request's blocks survived."""

from __future__ import annotations

from typing import Any

import msgspec


class _Usage(msgspec.Struct):
    usage: dict[str, Any] | None = None


_usage_decoder = msgspec.json.Decoder(_Usage)


def cached_tokens_of(payload: bytes) -> int | None:
    """``usage.prompt_tokens_details.cached_tokens`` of one JSON response/chunk."""
    try:
        usage = _usage_decoder.decode(payload).usage
    except msgspec.DecodeError:
        return None
    details = usage.get("prompt_tokens_details") if usage else None
    value = details.get("cached_tokens") if isinstance(details, dict) else None
    return value if isinstance(value, int) else None


def cached_tokens_of_stream(tail: bytes) -> int | None:
    """The same from the last SSE events of a stream (``include_usage``)."""
    for event in reversed(tail.split(b"\n\n")):
        data = event.strip()
        if data.startswith(b"data:") and b'"usage"' in data:
            value = cached_tokens_of(data[5:].strip())
            if value is not None:
                return value
    return None
