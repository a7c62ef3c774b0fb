"""The optional compiled core (``_core.c``): which one is active, and its entry points.

Why a C extension: the score's floors in pure Python (0.09 ms to hash 8k tokens, ~0.1 ms
for 1,024 dict lookups and ANDs, 70-80 bytes per engine-hash map entry) sit above the
Dynamo indexer's whole hash + match (docs/benchmarks.md, round 3). The core holds the
memory index's tables in ``U64Map`` (open addressing over uint64 keys; uint64 values for
the engine-hash maps) and chains block keys over the token buffer in one call.

Every caller keeps its pure-Python path and gets the same answers from either:
``KVROUTE_NATIVE=0`` forces Python (read once, at import); a build without the
extension (no compiler) or without libxxhash (``chain`` is None) falls back the same
way. ``ACTIVE`` names what runs ("native", "native-nohash" or "python"); /v1/health
and the ``kvroute_core_info`` metric report it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from itertools import repeat
from typing import Any

U64Map: Any = None
chain: Callable[[int, Sequence[int], int, int], list[int] | None] | None = None
rows: Callable[..., tuple[list[Any], list[int]]] | None = None
_pack: Callable[[Sequence[int], int], bytes] | None = None
labels: Callable[[Sequence[dict[int, int]], Sequence[int], int], list[list[int]]] | None = None
ACTIVE = "python"
WHY = "KVROUTE_NATIVE=0"

if os.environ.get("KVROUTE_NATIVE", "1") != "0":
    try:
        from router.native import _core  # type: ignore[attr-defined]
    except ImportError as exc:  # not built (no compiler at install time)
        WHY = f"not built: {exc}"
    else:
        U64Map = _core.U64Map
        chain = getattr(_core, "chain", None)
        rows = _core.rows
        labels = _core.labels
        _pack = _core.pack
        ACTIVE = "native" if chain is not None else "native-nohash"
        WHY = "" if chain is not None else "built without libxxhash"


def new_table() -> Any:
    """An empty presence table (block key -> bitset int): a ``U64Map`` or a dict."""
    return U64Map() if U64Map is not None else {}


def new_hash_map() -> Any:
    """An empty engine-hash map (engine hash -> block key), uint64 values when native."""
    return U64Map(u64_values=True) if U64Map is not None else {}


def pack(ints: Sequence[int], width: int) -> bytes:
    """Each int's ``width`` little-endian bytes, joined (bitset rows for numpy)."""
    if _pack is not None:
        return _pack(ints, width)
    return b"".join(map(int.to_bytes, ints, repeat(width), repeat("little")))
