"""Prefix warming: a long prompt reaches its engine a chunk at a time.

Why: an engine without ``--long-prefill-token-threshold`` gives a prompt in chunked
prefill the whole step budget until it is done, so a cached chat turn queued behind a
60k-token prompt waits seconds for it. Where the routing core shapes a request
(``Decision.warm``, the ``warm_chunk`` weight), the proxy first sends the chosen engine
``/v1/completions`` requests for the prompt's first ``L1``, ``L2``, ... token ids with
``max_tokens`` 1, one after another: each caches its prefix (prefix caching), and what
was queued meanwhile runs between them. Best effort: a warming request that fails, or
whose ``cached_tokens`` show that the previous one's blocks were evicted (re-warming would
compute the prompt again), ends warming, and the request goes as it is.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from enum import Enum
from typing import Any

import msgspec

from router.proxy.upstream import UpstreamError, UpstreamPool
from router.proxy.usage import cached_tokens_of

# Request fields that change what an engine caches a prompt under, or when it runs it.
_CARRIED = ("cache_salt", "priority")


class Warmed(Enum):
    DONE = "done"
    FAILED = "failed"  # a warming request failed: the request goes as it is
    EVICTED = "evicted"  # the previous warming request's blocks were gone


async def send_warming(
    upstream: UpstreamPool,
    url: str,
    body: Mapping[str, Any],
    tokens: Sequence[int],
    prefixes: Sequence[int],
    headers: list[tuple[bytes, bytes]],
) -> tuple[int, Warmed]:
    """Send the warming requests for ``prefixes`` (prompt lengths, ascending) to ``url``
    (the engine's ``/v1/completions``) one after another; the number sent and how it
    ended."""
    extra = {k: body[k] for k in _CARRIED if k in body}
    sent = 0
    previous = 0
    for length in prefixes:
        payload = {
            # Absent when the client named none (the fleet's one model serves it).
            **({"model": body["model"]} if "model" in body else {}),
            "prompt": list(tokens[:length]),
            "max_tokens": 1,
            "temperature": 0.0,
            **extra,
        }
        sent += 1
        try:
            response = await upstream.post(url, msgspec.json.encode(payload), headers)
        except UpstreamError:
            return sent, Warmed.FAILED
        try:
            answer = await response.read()
        except UpstreamError:
            return sent, Warmed.FAILED
        finally:
            response.close()
        if response.status != 200:
            return sent, Warmed.FAILED
        cached = cached_tokens_of(answer)
        if previous and cached is not None and cached < previous:
            return sent, Warmed.EVICTED
        previous = length
    return sent, Warmed.DONE
