"""Which client request headers the proxy passes on to an engine.

One rule for the forwarding hot path and the plain pass-throughs: everything the client
sent reaches the engine (W3C trace context, vLLM's ``X-data-parallel-rank``, custom
headers) except hop-by-hop and framing headers (the upstream client sets its own),
``Accept-Encoding`` (the router reads usage from the body it passes back), the router's
own ``x-kvroute-policy``, and the router's key: with ``api_key`` set the client's
``Authorization`` / ``X-API-Key`` are that key, which stays here.
"""

from __future__ import annotations

from collections.abc import Iterable

NOT_FORWARDED = frozenset(
    {
        b"host",
        b"content-length",
        b"content-type",
        b"transfer-encoding",
        b"connection",
        b"keep-alive",
        b"te",
        b"trailer",
        b"upgrade",
        b"expect",
        b"proxy-authorization",
        b"proxy-connection",
        b"accept-encoding",
        b"x-kvroute-policy",
    }
)
KEY_HEADERS = frozenset({b"authorization", b"x-api-key"})


def forwarded(headers: Iterable[tuple[bytes, bytes]], keyed: bool) -> list[tuple[bytes, bytes]]:
    """The headers (lower-case names, as ASGI gives them) an engine gets; ``keyed``: the
    router has a key (or the engines get one of their own), so the client's is dropped."""
    return [
        (name, value)
        for name, value in headers
        if name not in NOT_FORWARDED and not (keyed and name in KEY_HEADERS)
    ]
