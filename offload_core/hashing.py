"""vLLM-identical block hashing, for the engine side (public API: ``block_hashes``,
``external_hash``).

The implementation lives in ``schemas.hashing``: the engine and the router share it, and
neither owns it. This module keeps the engine's public import path.
"""

from schemas.hashing import (
    HASH_ALGOS,
    NONE_HASH_SEED,
    block_extra_keys,
    block_hashes,
    external_hash,
    hash_block,
    hash_function,
    none_hash,
)

__all__ = [
    "HASH_ALGOS",
    "NONE_HASH_SEED",
    "block_extra_keys",
    "block_hashes",
    "external_hash",
    "hash_block",
    "hash_function",
    "none_hash",
]
