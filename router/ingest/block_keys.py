"""Block keys the router can compute from token ids alone, and engine-hash detection.

Design (why one canonical chain for every engine): the index is always keyed by the
router's own chain ``key_i = xxh3_64(tokens_i || other_extras_i, seed=key_{i-1})`` rooted
at ``root(lora_name, cache_salt)`` (``tokens_i``: the block's int32 bytes); an engine's
wire hashes only feed a map engine hash -> key (removals, parents of later stores,
token-less offload stores). So:

* scoring hashes a request once per block size with one cheap chain, whatever hashing
  each worker's engine uses (vLLM sha256 / sha256_cbor, any PYTHONHASHSEED, xxhash,
  SGLang) -- the alternative, keying by the engine's own hash, would cost one vLLM chain
  (pickle + sha256, ~2x slower) per algorithm per request and still need this chain for
  the other engines;
* LoRA and cache salt are exact without knowing an adapter's path: they enter the root;
* the price is the map entry per (worker, block size, block), measured in
  ``benchmarks/router_core.py``.

Why xxh3 and not sha256: the chain is on every score's critical path (512 blocks for an
8k-token prompt); seeding xxh3_64 with the parent key chains without concatenating
bytes, and the loop costs ~40 us instead of ~200 us. Collision odds: keys are 64 bits
either way, so two different prefixes share a key with probability ~2^-64 per pair, and
an index of N distinct prefixes holds any colliding pair with probability about
N^2 / 2^65 (1e-7 at 2M, 3e-4 at 100M). xxh3 is not collision resistant: a crafted prompt
could be made to share a key with another, which can only mislead a routing decision
(the engine checks its own hashes), never change what an engine computes. The root
stays a sha256 of the LoRA name and salt (computed once per pair, cached).

``detect_engine_hash`` still tells whether a worker's engine uses vLLM's default hashing
(reported per worker as ``hash_mode``: "engine" or "canonical").

Extra keys. Our engine (``schemas.hashing``) sends ``("lora", name, path)`` on every
block and ``("cache_salt", salt)`` on the first; vLLM sends the bare LoRA name and a bare
salt string. Both are folded into the root. Any other extra key (multimodal hashes,
prompt embeddings) enters that block's key, so a token-only request never matches such a
block: it under-predicts rather than guesses. Limit: vLLM's bare salt is recognised only
as the single non-LoRA string of the first block.
"""

from __future__ import annotations

import hashlib
import struct
from array import array
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

import msgspec
import xxhash

from router import native
from schemas.hashing import HASH_ALGOS, NONE_HASH_SEED, external_hash, hash_block

_msgpack = msgspec.msgpack.Encoder()
_xxh3_64 = xxhash.xxh3_64_intdigest
_WIDE_TAG = b"\x01"  # prefix of a block whose tokens do not all fit in int32
_EXTRA_TAG = b"\x00"  # separates a block's other extra keys from its tokens


@lru_cache(maxsize=1024)
def root_digest(lora_name: str | None = None, cache_salt: str | None = None) -> bytes:
    """The 8-byte parent of a chain's first block."""
    return hashlib.sha256(_msgpack.encode(["kvroute-root", lora_name, cache_salt])).digest()[:8]


def _encode_tokens(tokens: Sequence[int]) -> bytes | None:
    """int32 array bytes, or None when a token does not fit (slow per-block path).

    ``struct.pack`` of native ints gives the same bytes as ``array("i", ...)`` in half
    the time (0.05 vs 0.11 ms for 8k tokens) and fails on the same inputs."""
    try:
        return struct.pack(f"{len(tokens)}i", *tokens)
    except (struct.error, OverflowError, TypeError):
        return None


def _encode_block_slow(block: Sequence[int]) -> bytes:
    try:
        return array("i", block).tobytes()
    except (OverflowError, TypeError):
        return _WIDE_TAG + _msgpack.encode(list(block))


def chain_keys(
    parent: bytes,
    tokens: Sequence[int],
    block_size: int,
    n_blocks: int,
    extras: Sequence[bytes | None] | None = None,
) -> list[int]:
    """Keys of ``n_blocks`` consecutive blocks of ``tokens`` chained from ``parent``."""
    xxh = _xxh3_64
    seed = int.from_bytes(parent, "big")
    if native.chain is not None and extras is None:  # router/native: the same keys in C
        got = native.chain(seed, tokens, block_size, n_blocks)
        if got is not None:
            return got
    out: list[int] = []
    push = out.append
    tb = _encode_tokens(tokens[: n_blocks * block_size])
    if tb is not None and extras is None:
        # Hot path (every score, every store): one C call per block in the loop.
        width = 4 * block_size
        for pos in range(0, n_blocks * width, width):
            seed = xxh(tb[pos : pos + width], seed)
            push(seed)
        return out
    for i in range(n_blocks):
        data = _encode_block_slow(tokens[i * block_size : (i + 1) * block_size])
        extra = extras[i] if extras is not None and i < len(extras) else None
        if extra is not None:
            data += _EXTRA_TAG + extra
        seed = xxh(data, seed)
        push(seed)
    return out


# Ranges at least this long are kept as 8-byte words (``compact_keys``).
COMPACT_MIN = 16


def compact_keys(keys: Sequence[int]) -> Sequence[int]:
    """Block keys to keep for later (the ingestor's recent ranges): a long range as an
    array of uint64 words, 8 bytes a key instead of an int object and its pointer (~40).
    Measured: a fleet whose stores are whole conversations kept every key it ingested
    there, 43 bytes per index entry at 64 workers; short ranges stay lists (a step's
    few blocks cost little, and converting them would cost each store)."""
    if len(keys) < COMPACT_MIN:
        return keys
    try:
        return array("Q", keys)
    except (OverflowError, TypeError):  # not all uint64: kept as they are
        return keys


def key_bytes(key: int) -> bytes:
    """A key as the 8-byte parent of its children (the inverse of the int form)."""
    return key.to_bytes(8, "big")


def request_keys(
    token_ids: Sequence[int],
    block_size: int,
    lora_name: str | None = None,
    cache_salt: str | None = None,
) -> list[int]:
    """Keys of every full block of a request, for one block size."""
    n = len(token_ids) // block_size
    return chain_keys(root_digest(lora_name, cache_salt), token_ids, block_size, n)


def _tuplify(value: Any) -> Any:
    if isinstance(value, list | tuple):
        return tuple(_tuplify(v) for v in value)
    return value


class ExtraKeys(msgspec.Struct, frozen=True):
    """A stored event's extra keys split into what the root needs and the rest."""

    lora_name: str | None
    cache_salt: str | None
    others: list[bytes | None] | None


def split_extra_keys(
    extra_keys: Sequence[Any] | None, n_blocks: int, lora_name: str | None
) -> ExtraKeys:
    """Fold LoRA / cache-salt keys into root inputs; encode every other key per block."""
    lora = lora_name
    salt: str | None = None
    others: list[bytes | None] | None = None
    if not extra_keys:
        return ExtraKeys(lora, salt, None)
    for i, block_keys in enumerate(extra_keys[:n_blocks]):
        if not block_keys:
            continue
        rest: list[Any] = []
        for item in block_keys:
            if isinstance(item, list | tuple) and len(item) >= 2 and item[0] == "lora":
                lora = lora if lora is not None else str(item[1])
            elif isinstance(item, list | tuple) and len(item) == 2 and item[0] == "cache_salt":
                if i == 0:
                    salt = str(item[1])
                else:
                    rest.append(item)
            elif isinstance(item, str) and lora is not None and item == lora:
                continue
            else:
                rest.append(item)
        if i == 0 and salt is None and len(rest) == 1 and isinstance(rest[0], str):
            salt = rest.pop()  # vLLM's bare cache salt
        if rest:
            if others is None:
                others = [None] * n_blocks
            others[i] = _msgpack.encode(_tuplify(rest))
    return ExtraKeys(lora, salt, others)


def detect_engine_hash(
    wire_hash: int | bytes, first_block_tokens: Sequence[int], extra_keys_0: Any = None
) -> str | None:
    """The vLLM algorithm (``sha256``/``sha256_cbor``) reproducing a chain's first block
    hash with the default seed, or None when neither does (foreign hashing)."""
    extra = _tuplify(extra_keys_0) if extra_keys_0 else None
    for algo in HASH_ALGOS:
        try:
            digest = hash_block(None, first_block_tokens, extra, algo, seed=NONE_HASH_SEED)
        except Exception:  # unhashable extra keys from a foreign engine
            return None
        if isinstance(wire_hash, bytes):
            if digest == wire_hash:
                return algo
        elif external_hash(digest) == wire_hash:
            return algo
    return None
