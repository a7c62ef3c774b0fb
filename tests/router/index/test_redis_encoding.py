"""The Redis backend's bulk encoders equal their one-value-at-a-time definitions."""

from __future__ import annotations

import random

import pytest

from router.index.redis import encode_hash, encode_hashes, key_blob


@pytest.mark.parametrize(
    "hashes",
    [
        [0, 1, 2**64 - 1, 12345678901234567],
        [random.Random(3).getrandbits(64) for _ in range(500)],
        [True, 7],
        [b"\x01" * 32, b"\x02" * 32],  # digests: one width, per-hash path
        [-5, 7, 2**64],  # widths differ: separate fields
        [b"ab", 3],
    ],
)
def test_encode_hashes_matches_encode_hash(hashes: list[int | bytes]) -> None:
    fields = [encode_hash(h) for h in hashes]
    width, got = encode_hashes(hashes)
    if len({len(f) for f in fields}) == 1:
        assert (width, got) == (len(fields[0]), b"".join(fields))
    else:
        assert (width, got) == (0, fields)


def test_key_blob_is_big_endian_words() -> None:
    keys = [0, 1, 2**64 - 1, *(random.Random(5).getrandbits(64) for _ in range(100))]
    assert key_blob(keys) == b"".join(k.to_bytes(8, "big") for k in keys)
    with pytest.raises(OverflowError):
        key_blob([2**64])
