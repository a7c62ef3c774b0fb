"""Published batches whose token ids stay bytes until a path needs them as ints.

Why: decoding a batch's token ids into Python ints, and freeing them again after the
index write, was about a third of the router's ingest CPU end to end, yet the fast path
(``router.ingest.fast_path``) only hashes them. With the compiled core active, the
subscriber decodes stores as ``PackedBlockStored``: the core first rewrites every
``token_ids`` array of the payload as one bin of native int32s, checking each id
(``int32_tokens``), and the strict decode reads that bin as one ``bytes`` object
(``schemas.decode.decode_int32``; msgspec walking the ids to skip them was most of the
decode). Where the rewrite declines, stores keep their msgpack bytes (``Raw``,
``decode_packed``) and the core checks each array (``packed_len``). Either way the fast
path chains keys straight from the bytes (``chain_packed``, the same keys as ``chain``).
Any other path gets the batch ``unpack``-ed first, so nothing else ever sees packed
tokens; without the core (``KVROUTE_NATIVE=0``, no compiler) the subscriber decodes as
before.
"""

from __future__ import annotations

from array import array
from typing import Any

import msgspec

from router import native
from schemas import BlockStored, KVEventBatch
from schemas.decode import PackedBlockStored, decode_int32, decode_packed

_tokens = msgspec.msgpack.Decoder(list[int])


def decode(payload: bytes) -> KVEventBatch | None:
    """The batch with packed stores, or None (the caller decodes it the usual way) when
    the core is off, the payload is not the common form, or a token is not an int32."""
    check = native.packed_len
    if check is None:
        return None
    rewrite = native.int32_tokens
    rewritten = rewrite(payload) if rewrite is not None else None
    if rewritten is not None:
        batch = decode_int32(rewritten)
        if batch is not None:
            return batch
    batch = decode_packed(payload)
    if batch is None:
        return None
    for ev in batch.events:
        if type(ev) is PackedBlockStored and check(ev.token_ids) < 0:
            return None
    return batch


def tokens(ids: Any) -> Any:
    """Token ids as a list of ints (packed bytes decoded; anything else as it is)."""
    if isinstance(ids, msgspec.Raw):
        return _tokens.decode(ids)
    if type(ids) is bytes:  # native int32s (int32_tokens)
        return array("i", ids).tolist()
    return ids


def unpack(batch: KVEventBatch) -> KVEventBatch:
    """``batch`` with every packed store as a plain ``BlockStored`` (the same object
    when it holds none)."""
    events = batch.events
    if not any(type(ev) is PackedBlockStored for ev in events):
        return batch
    out: list[Any] = [_plain(ev) if type(ev) is PackedBlockStored else ev for ev in events]
    return KVEventBatch(batch.ts, out, batch.data_parallel_rank)


def _plain(ev: PackedBlockStored) -> BlockStored:
    fields = msgspec.structs.asdict(ev)
    fields["token_ids"] = tokens(ev.token_ids)
    return BlockStored(**fields)
