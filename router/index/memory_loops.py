"""The memory index's write loops in Python: what ``router.native``'s ``U64Map.store``
and ``U64Map.remove`` do in C, for plain dict tables (no compiled core) and for a worker
with extra copies of some block (the C removal leaves those to this loop). Their own
module so ``router.index.memory`` (the tables and the dispatch) stays short; both must
answer alike (``tests/router/native/``)."""

from __future__ import annotations

from typing import Any

from router.index.base import BlockKey, EngineHash, RemoveOp, StoreOp


def store_loop(
    t: Any, emap: Any, op: StoreOp, b: int, anyb: int, solo: int
) -> tuple[int, int, list[BlockKey]]:
    """Per block: its key is ``emap.setdefault(hash, key)``; unless the key's value
    already holds bit ``b``, the value gains ``b`` and ``anyb`` (``solo`` when the key
    was absent). Returns (blocks stored, keys the worker did not hold on any medium
    before, the keys whose bit was set already: other physical copies), as
    ``U64Map.store`` does. Consecutive blocks with the same old value share the new one
    (``router/native/memo.h``)."""
    own = 0xF * anyb
    get, setdefault = t.get, emap.setdefault
    new = fresh = 0
    again: list[BlockKey] = []
    last: int | None = None
    nv = 0
    for h, k in zip(op.hashes, op.keys, strict=True):
        k = setdefault(h, k)
        v = get(k, 0)
        if v & b:
            again.append(k)
            continue
        if not v & own:
            fresh += 1
        if v is not last:
            last, nv = v, v | b | anyb if v else solo
        t[k] = nv
        new += 1
    return new, fresh, again


def remove_loop(
    t: Any,
    emap: Any,
    op: RemoveOp,
    b: int,
    anyb: int,
    copies: dict[tuple[int, int, BlockKey], int],
    siblings: list[Any],
) -> tuple[int, int, int, list[tuple[EngineHash, BlockKey]]]:
    """Per hash held on bit ``b``: one extra copy goes if there is one (the block stays);
    else ``b`` is cleared, and ``anyb`` with it when no medium is left (the entry goes
    when nothing is left). A key the worker then holds on no medium, in no sibling
    table either, leaves ``emap``. Returns (blocks removed, keys no longer held, extra
    copies dropped, the (hash, key) mappings that left ``emap``, in order)."""
    own = 0xF * anyb
    media = own ^ anyb
    get = t.get
    new = fresh = dropped = 0
    gone: list[tuple[EngineHash, BlockKey]] = []
    last: int | None = None
    nv = 0
    for h in op.hashes:
        k = emap.get(h)
        v = 0 if k is None else get(k, 0)
        if not v & b:
            continue
        new += 1
        if copies:
            c = (op.group, op.medium_bit, k)
            extra = copies.get(c)
            if extra:  # one copy goes, the block stays cached
                if extra > 1:
                    copies[c] = extra - 1
                else:
                    del copies[c]
                dropped += 1
                continue
        if v is not last:
            last, nv = v, v ^ b
            if not nv & media:
                nv ^= anyb  # no medium left: not held at all
        if nv:
            t[k] = nv
        else:
            del t[k]
        if not nv & own:
            fresh += 1
            if not any(s.get(k, 0) & own for s in siblings):
                del emap[h]
                gone.append((h, k))
    return new, fresh, dropped, gone
