"""Encodings of the Redis index: key names, engine-hash fields, key blobs, metadata.

Split from ``router.index.redis`` (the backend's calls): the byte formats the Lua
scripts (``router.index.redis_lua``) read and write, in one place.
"""

from __future__ import annotations

import random
import sys
import zlib
from array import array
from collections.abc import Sequence
from typing import Any, cast

import msgspec

from router.index.base import (
    FOLLOWS_ANY,
    BlockKey,
    ClearOp,
    EngineHash,
    EngineSettings,
    GroupMeta,
    Op,
    SeqOp,
    StoreOp,
    WorkerState,
)
from router.index.redis_cache import MappingCache

# (worker, block size, engine hashes, keys) a write will map once Redis took it.
Learned = tuple[str, int, Sequence[EngineHash], Sequence[BlockKey]]

_OP_CHUNK = 2000  # hashes per scripted op: keeps unpack() far below Lua's stack limit

NAMESPACE = "kvroute:"


def index_prefix(shard: int) -> str:
    """``kvroute:{ix:<shard>}:`` -- the hash tag of one shard: its workers' keys and the
    shared rows of those workers live in one Redis Cluster slot, so no script crosses
    slots (``router.index.redis_lua``)."""
    return f"{NAMESPACE}{{ix:{shard}}}:"


def shard_of(worker_id: str, shards: int) -> int:
    """A worker's shard: a stable hash of its id (one shard on a single server)."""
    return zlib.crc32(worker_id.encode()) % shards if shards > 1 else 0


INDEX_PREFIX = index_prefix(0)  # shard 0 also holds the worker set and registrations


class State(msgspec.Struct, array_like=True):
    hash_mode: str
    groups: dict[int, GroupMeta]
    hash_unit: int | None = None
    settings: EngineSettings = EngineSettings()

    def worker_state(self) -> WorkerState:
        return WorkerState(dict(self.groups), self.hash_mode, self.hash_unit, self.settings)


state_enc = msgspec.msgpack.Encoder()
state_dec = msgspec.msgpack.Decoder(State)


def worker_prefix(worker_id: str, shards: int = 1) -> str:
    """``kvroute:{ix:<shard>}:w:<id>:`` -- a worker's own keys, in its shard's slot."""
    return f"{index_prefix(shard_of(worker_id, shards))}w:{worker_id}:"


def encode_hash(h: EngineHash) -> bytes:
    """An engine hash as a Redis field: ints and digests never collide."""
    if isinstance(h, bytes):
        return b"b" + h
    if 0 <= h < 1 << 64:
        return b"i" + h.to_bytes(8, "big")
    return b"I" + str(h).encode()


def encode_hashes(hashes: Sequence[EngineHash]) -> tuple[int, bytes | list[bytes]]:
    """``encode_hash`` of each hash as (width, one blob) when all share a width, else
    (0, the fields). The common case -- 64-bit unsigned ints -- runs in C: one array
    conversion and nine strided copies instead of a Python call per hash."""
    try:
        words = array("Q", cast("Sequence[int]", hashes))  # bytes hashes: TypeError
    except (OverflowError, TypeError):
        fields = [encode_hash(h) for h in hashes]
        width = len(fields[0])
        if all(len(f) == width for f in fields):
            return width, b"".join(fields)
        return 0, fields
    n = len(words)
    out = bytearray(9 * n)
    out[0::9] = b"i" * n
    raw = _be_bytes(words)
    for b in range(8):
        out[1 + b :: 9] = raw[b::8]
    return 9, bytes(out)


def _be_bytes(words: array[int]) -> bytes:
    """Unsigned 64-bit words as consecutive 8-byte big-endian strings."""
    if sys.byteorder == "little":
        words.byteswap()
    return words.tobytes()


def key_blob(keys: Sequence[BlockKey]) -> bytes:
    """Block keys as consecutive 8-byte big-endian strings (what the scripts read)."""
    return _be_bytes(array("Q", keys))


# A shared row's field is its block key's last ROW_KEY_BYTES bytes (big-endian): a
# 6-byte field fits Redis's 8-byte allocation class (8 bytes take 16), 8 bytes less per
# row. Why that is safe enough: two distinct blocks of one (shard, group) share a field
# with probability ~N^2 / 2^49 over N blocks (~1e-3 at a million, ~1 at 25 million) and
# then only merge holders for those two blocks; a worker's hit grows only if it holds
# every block before the colliding one. Keys themselves (maps, parents) stay 64-bit.
ROW_KEY_BYTES = 6


def row_blob(keys: Sequence[BlockKey]) -> bytes:
    """Block keys as consecutive row fields (``ROW_KEY_BYTES`` each), for ``FETCH``."""
    raw = key_blob(keys)
    n = len(keys)
    out = bytearray(ROW_KEY_BYTES * n)
    for b in range(ROW_KEY_BYTES):
        out[b::ROW_KEY_BYTES] = raw[8 - ROW_KEY_BYTES + b :: 8]
    return bytes(out)


def count_and_map_keys(
    prefixes: Sequence[str], key_sets: Sequence[set[bytes]]
) -> tuple[list[str], list[str]]:
    """The ``n:<group>`` and ``e:<block size>`` key names of workers (their prefixes) from
    their key sets' "group block_size" pairs (``router.index.redis_lua``); a member that
    is not a pair (a key name, written before round 4b) is skipped."""
    counts: list[str] = []
    maps: dict[str, None] = {}  # one map per block size, shared by its groups
    for prefix, members in zip(prefixes, key_sets, strict=True):
        for gb in members:
            g, _, bs = gb.decode().partition(" ")
            if bs:
                counts.append(f"{prefix}n:{g}")
                maps[f"{prefix}e:{bs}"] = None
    return counts, list(maps)


def new_epoch() -> int:
    """A fresh epoch token (see the module docstring); random, so a worker removed and
    created again never gets a token a cache was built under."""
    return random.getrandbits(52) + 1


def plan_of(groups: dict[int, GroupMeta]) -> str:
    order = sorted(groups.items(), key=lambda kv: (kv[1].rule != "full", kv[0]))
    return ";".join(f"{g},{m.block_size},{int(m.rule == 'full')}" for g, m in order)


def apply_args(
    worker_id: str,
    ghost_cap: int,
    groups: dict[int, GroupMeta],
    ops: Sequence[Op],
    learned: list[Learned],
    cache: MappingCache,
    shards: int = 1,
    clears: dict[str, bytes] | None = None,
) -> list[Any]:
    """``APPLY``'s arguments for one worker's ops (format: ``router.index.redis_lua``);
    ``learned`` collects the mappings to cache once Redis took the write, ``clears`` the
    epoch of the worker's last clear in these ops. Per op only
    what differs is built: a group's header tail once per call, and a hybrid model's
    second group (same hashes and keys) reuses the first one's blobs."""
    prefix = worker_prefix(worker_id, shards)
    xprefix = index_prefix(shard_of(worker_id, shards))
    args: list[Any] = [prefix, ghost_cap, xprefix, worker_id]
    tails: dict[tuple[int, int], tuple[int, str, str]] = {}
    last: tuple[Any, Any, Any, Any] = (None, None, None, None)  # hashes, keys, their blobs
    for op in ops:
        if isinstance(op, SeqOp):
            f = "" if op.follows == FOLLOWS_ANY else f" {op.follows}"
            args.append(f"4 {op.rank} {op.seq} {op.fingerprint}{f}".encode())
            continue
        if isinstance(op, ClearOp):
            epoch = str(new_epoch()).encode()
            args.append(b"3 " + epoch)
            if clears is not None:
                clears[worker_id] = epoch
            cache.forget(worker_id)
            # Mappings learned before the clear in this call are void after it.
            learned[:] = [x for x in learned if x[0] != worker_id]
            last = (None, None, None, None)
            continue
        t = tails.get((op.group, op.medium_bit))
        if t is None:
            bs = groups[op.group].block_size
            sibs = [g for g, m in groups.items() if g != op.group and m.block_size == bs]
            t = tails[(op.group, op.medium_bit)] = (
                bs,
                f"{op.group} {bs} {op.medium_bit}",
                " ".join(map(str, (len(sibs), *sibs))),
            )
        bs, tail, sib_tail = t
        store = isinstance(op, StoreOp)
        hashes = op.hashes
        keys: Sequence[BlockKey] = op.keys if isinstance(op, StoreOp) else ()
        if store:
            same = hashes == last[0] and keys == last[1]
            if not (same and learned and learned[-1][:2] == (worker_id, bs)):
                learned.append((worker_id, bs, hashes, keys))
        else:  # the server may drop these map entries: ask it again when needed
            same = False
            cache.unremember(worker_id, bs, hashes)
        op_code = 1 if store else 2
        if len(hashes) <= _OP_CHUNK:
            if same:
                hblob, kblob = last[2], last[3]
            else:
                hblob = encode_hashes(hashes)
                kblob = key_blob(keys) if store else None
                last = (hashes, keys, hblob, kblob)
            _append_op(args, op_code, tail, sib_tail, len(hashes), hblob, kblob)
            continue
        for lo in range(0, len(hashes), _OP_CHUNK):  # Lua's unpack() has a limit
            chunk = hashes[lo : lo + _OP_CHUNK]
            kblob = key_blob(keys[lo : lo + _OP_CHUNK]) if store else None
            _append_op(args, op_code, tail, sib_tail, len(chunk), encode_hashes(chunk), kblob)
        last = (None, None, None, None)
    return args


def _append_op(
    args: list[Any],
    op_code: int,
    tail: str,
    sib_tail: str,
    n: int,
    hblob: tuple[int, bytes | list[bytes]],
    kblob: bytes | None,
) -> None:
    width, hashes = hblob
    args.append(f"{op_code} {tail} {n} {width} {sib_tail}".encode())
    if isinstance(hashes, bytes):
        args.append(hashes)
    else:
        args += hashes
    if kblob is not None:
        args.append(kblob)
