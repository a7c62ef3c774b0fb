"""vLLM-identical prefix block hashing (no torch: the router imports this too).

A block's digest is ``H((parent_digest or NONE_HASH, tuple(block_tokens), extra_keys))``
where ``H`` is sha256 over pickle protocol 5 (``sha256``) or over canonical CBOR
(``sha256_cbor``). ``extra_keys`` is a tuple of key tuples or None: LoRA adds
``("lora", name, path)`` to every block, a cache salt adds ``("cache_salt", salt)`` to the
first block only. Engines publish the external form: the low 64 bits of the digest.
"""

from __future__ import annotations

import hashlib
import os
import pickle
from collections.abc import Callable, Sequence
from functools import cache
from typing import Any, Literal

import cbor2

HashAlgo = Literal["sha256", "sha256_cbor"]
HASH_ALGOS: tuple[str, ...] = ("sha256", "sha256_cbor")
NONE_HASH_SEED = "vllm-none-hash"


def _sha256_pickle(obj: Any) -> bytes:
    return hashlib.sha256(pickle.dumps(obj, protocol=5)).digest()


def _sha256_cbor(obj: Any) -> bytes:
    return hashlib.sha256(cbor2.dumps(obj, canonical=True)).digest()


_HASH_FNS: dict[str, Callable[[Any], bytes]] = {
    "sha256": _sha256_pickle,
    "sha256_cbor": _sha256_cbor,
}


def hash_function(algo: str) -> Callable[[Any], bytes]:
    try:
        return _HASH_FNS[algo]
    except KeyError:
        raise ValueError(f"unknown hash algorithm {algo!r}; expected one of {HASH_ALGOS}") from None


@cache
def none_hash(algo: str = "sha256", seed: str | None = None) -> bytes:
    """The parent digest of a chain's first block.

    vLLM derives it from ``PYTHONHASHSEED`` when set, else from the fixed seed
    ``"vllm-none-hash"``; pass ``seed`` to model an engine with a known seed.
    """
    if seed is None:
        seed = os.getenv("PYTHONHASHSEED") or NONE_HASH_SEED
    return hash_function(algo)(seed)


def external_hash(digest: bytes) -> int:
    """The int an engine publishes for a digest: its low 64 bits, big-endian."""
    return int.from_bytes(digest[-8:], "big")


def block_extra_keys(
    block_index: int,
    cache_salt: str | None = None,
    lora: tuple[str, str] | None = None,
) -> tuple[tuple[Any, ...], ...] | None:
    """Extra keys entering block ``block_index``'s hash (None when there are none)."""
    keys: list[tuple[Any, ...]] = []
    if lora is not None:
        keys.append(("lora", lora[0], lora[1]))
    if cache_salt is not None and block_index == 0:
        keys.append(("cache_salt", cache_salt))
    return tuple(keys) if keys else None


def hash_block(
    parent: bytes | None,
    tokens: Sequence[int],
    extra_keys: tuple[Any, ...] | None = None,
    algo: str = "sha256",
    seed: str | None = None,
) -> bytes:
    """Digest of one full block given its parent's digest (None for the first block)."""
    if parent is None:
        parent = none_hash(algo, seed)
    return hash_function(algo)((parent, tuple(tokens), extra_keys))


def block_hashes(
    token_ids: Sequence[int],
    block_size: int,
    algo: str = "sha256",
    cache_salt: str | None = None,
    lora: tuple[str, str] | None = None,
    seed: str | None = None,
) -> list[bytes]:
    """Full digests of every *full* block of ``token_ids``, as vLLM computes them."""
    if block_size <= 0:
        raise ValueError("block_size must be positive")
    fn = hash_function(algo)
    parent = none_hash(algo, seed)
    out: list[bytes] = []
    n_full = len(token_ids) // block_size
    for i in range(n_full):
        extra = block_extra_keys(i, cache_salt, lora)
        parent = fn((parent, tuple(token_ids[i * block_size : (i + 1) * block_size]), extra))
        out.append(parent)
    return out
