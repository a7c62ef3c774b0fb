"""SGLang's own block hashes (0.5.20+), computed from token ids, and their detection.

SGLang hashes a radix page as ``sha256(previous digest || page token ids as u32
little-endian)`` (a page with an id above 2**32-1 is hashed as ``0xff || u64 LE ids``
instead), the first page of a chain with no previous digest; its KV events carry the
first 8 bytes of each digest as a signed big-endian int64. A ``cache_salt`` seeds the
chain with ``sha256(b"sglang-cache-salt-v1\\0" + salt)``. A LoRA chain is further
namespaced by a seed derived from the adapter's internal id (which the router never
sees), so LoRA chains are not reproducible from the adapter name: the index still keys
them exactly, through the canonical chain rooted at the ``lora_name`` of the event.

Why compute them at all, when the index is keyed by the canonical chain: to tell a
worker's ``hash_mode`` ("engine": the router can name SGLang's blocks itself, so scores
could use SGLang's own keys and the engine-hash map is a pure cache; "canonical":
unknown hashing, the map is the only way to resolve removals) and so that a client can
compute the very keys SGLang reports (``request_block_hashes``).
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence

SALT_SEED_TAG = b"sglang-cache-salt-v1\0"
_U32_MAX = 0xFFFFFFFF
_I64_MAX = 0x7FFFFFFFFFFFFFFF
_WIDE_TAG = b"\xff"


def salt_seed(cache_salt: str | None) -> bytes | None:
    """The 32-byte digest a salted chain starts from (None: no salt, no seed)."""
    if cache_salt is None or cache_salt == "":  # SGLang treats an empty salt as none
        return None
    return hashlib.sha256(SALT_SEED_TAG + cache_salt.encode("utf-8")).digest()


def _page_bytes(page: Sequence[int]) -> bytes:
    if all(0 <= t <= _U32_MAX for t in page):
        return struct.pack(f"<{len(page)}I", *page)
    # SGLang's hasher takes ids as int64 and refuses any above 2**63-1 (hash_binding.cpp:
    # "token id must be a non-negative int64"); a u64 pack alone would accept them.
    if any(t > _I64_MAX for t in page):
        raise struct.error("token id above int64")
    return _WIDE_TAG + struct.pack(f"<{len(page)}Q", *page)


def page_digests(
    token_ids: Sequence[int], page_size: int, prior: bytes | None = None
) -> list[bytes]:
    """SHA-256 digest of every page (the last one may be partial), chained from ``prior``.

    Raises ``ValueError`` for a negative token id or one above int64 (SGLang refuses them
    too) and for ``page_size < 1``.
    """
    if page_size < 1:
        raise ValueError("page_size must be positive")
    out: list[bytes] = []
    sha = hashlib.sha256
    for start in range(0, len(token_ids), page_size):
        page = token_ids[start : start + page_size]
        try:
            data = _page_bytes(page)
        except struct.error as exc:
            raise ValueError(f"token id out of range: {exc}") from None
        prior = sha(data if prior is None else prior + data).digest()
        out.append(prior)
    return out


def event_hash(digest: bytes) -> int:
    """A digest as SGLang's event hash: the first 8 bytes, signed big-endian."""
    return int.from_bytes(digest[:8], "big", signed=True)


def request_block_hashes(
    token_ids: Sequence[int], page_size: int, cache_salt: str | None = None
) -> list[int]:
    """SGLang's event hashes of every full page of a request (no LoRA)."""
    n = len(token_ids) // page_size * page_size
    digests = page_digests(token_ids[:n], page_size, salt_seed(cache_salt))
    return [event_hash(d) for d in digests]


def detect_sglang_hash(
    wire_hash: int | bytes, first_block_tokens: Sequence[int], cache_salt: str | None = None
) -> bool:
    """Whether the first block of a chain carries SGLang's hash of its tokens.

    Accepts the hash as a signed int64 (SGLang) or its unsigned reading (a relay that
    re-encodes it as uint64)."""
    if not first_block_tokens or not isinstance(wire_hash, int) or isinstance(wire_hash, bool):
        return False
    try:
        (digest,) = page_digests(first_block_tokens, len(first_block_tokens), salt_seed(cache_salt))
    except (ValueError, TypeError):
        return False
    h = event_hash(digest)
    return wire_hash in (h, h & 0xFFFFFFFFFFFFFFFF)
