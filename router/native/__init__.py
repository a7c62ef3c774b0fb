"""The optional compiled core (``_core.c``): which one is active, and its entry points.

Why a C extension: the score's floors in pure Python (0.09 ms to hash 8k tokens, ~0.1 ms
for 1,024 dict lookups and ANDs, 70-80 bytes per engine-hash map entry) sat above the
Dynamo indexer's whole hash + match (docs/benchmarks.md, round 3). The core holds the
memory index's tables in ``U64Map`` (open addressing over uint64 keys; uint64 values for
the engine-hash maps), chains block keys over the token buffer in one call, and runs the
scorer's per-worker loop (classes and rows) without bytecode.

Every caller keeps its pure-Python path and gets the same answers from either; callers
read this module's attributes at call time (``native.rows``), so ``set_active`` switches
a whole process (tests run each case on both). ``KVROUTE_NATIVE=0`` starts on Python; a
build without the extension (no compiler) or without libxxhash (``chain`` is None) falls
back the same way. ``ACTIVE`` names what runs ("native", "native-nohash" or "python");
/v1/health and the ``kvroute_core_info`` metric report it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from itertools import repeat
from typing import Any

try:
    from router.native import _core  # type: ignore[attr-defined]

    BUILD_ERROR = ""
except ImportError:  # not built (no compiler at install time, or KVROUTE_NATIVE_BUILD=0)
    _core = None
    BUILD_ERROR = "the extension is not built (no C compiler at install time?)"

U64Map: Any = None
chain: Callable[[int, Sequence[int], int, int], list[int] | None] | None = None
# Token ids still as msgpack bytes (router.ingest.packed): their count, and chain() over them.
packed_len: Callable[..., int] | None = None
chain_packed: Callable[[int, Any, int, int], list[int] | None] | None = None
int32_tokens: Callable[[bytes], bytes | None] | None = None
chain_int32: Callable[[int, bytes, int, int], list[int] | None] | None = None
rows: Callable[..., tuple[list[Any], list[tuple[int, Any]]]] | None = None
_pack: Callable[[Sequence[int], int], bytes] | None = None
tiers: Callable[..., tuple[list[int], list[int]]] | None = None
sweep: Callable[[list[tuple[int, int]], list[int], int], dict[int, int]] | None = None
windows: Callable[[list[int], int], list[int]] | None = None
ACTIVE = "python"


def set_active(on: bool) -> str:
    """Use the compiled core (when built) or the pure-Python paths from now on; returns
    ``ACTIVE``. Tables already made keep their type (both answer alike)."""
    global U64Map, chain, packed_len, chain_packed, int32_tokens, chain_int32, rows, _pack
    global tiers, sweep, windows, ACTIVE
    core = _core if on else None
    U64Map = getattr(core, "U64Map", None)
    chain = getattr(core, "chain", None)
    packed_len = getattr(core, "packed_len", None)
    chain_packed = getattr(core, "chain_packed", None)
    int32_tokens = getattr(core, "int32_tokens", None)
    chain_int32 = getattr(core, "chain_int32", None)
    rows = getattr(core, "rows", None)
    _pack = getattr(core, "pack", None)
    tiers = getattr(core, "tiers", None)
    sweep = getattr(core, "sweep", None)
    windows = getattr(core, "windows", None)
    ACTIVE = "python" if core is None else "native" if chain is not None else "native-nohash"
    return ACTIVE


def available() -> bool:
    """Whether the extension was built (``set_active(True)`` can take effect)."""
    return _core is not None


def describe() -> dict[str, str]:
    """What /v1/health reports: the active core and, when Python, why."""
    why = ""
    if ACTIVE == "python":
        why = BUILD_ERROR or "KVROUTE_NATIVE=0"
    elif ACTIVE == "native-nohash":
        why = "built without libxxhash: python xxhash hashes the chain"
    return {"core": ACTIVE, "reason": why}


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
    return b"".join(map(int.to_bytes, ints, repeat(width), repeat("little")))  # type: ignore[arg-type]


set_active(os.environ.get("KVROUTE_NATIVE", "1") != "0")
