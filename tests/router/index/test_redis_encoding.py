"""The Redis backend's bulk encoders equal their one-value-at-a-time definitions."""

from __future__ import annotations

import random

import pytest

from router.index.redis import encode_hash, encode_hashes, key_blob
from router.index.redis_codec import ROW_KEY_BYTES, row_blob


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


def test_row_fields_are_the_keys_last_six_bytes() -> None:
    """``FETCH`` reads rows by ``row_blob``'s fields; ``APPLY`` writes them as
    ``sub(key, 3, 8)`` of the 8-byte key: both must be the key's low 48 bits."""
    keys = [0, 1, 2**48 - 1, 2**64 - 1, *(random.Random(6).getrandbits(64) for _ in range(100))]
    assert ROW_KEY_BYTES == 6
    assert row_blob(keys) == b"".join(k.to_bytes(8, "big")[2:] for k in keys)


def _matrix_by_rows(n: int, width: int, nread: int, rows: bytes) -> list[list[int]]:
    """``_matrix``'s definition, one row and one holder at a time."""
    out = [[0] * width for _ in range(n)]
    for r, row in enumerate(rows.split(b"\0")[:nread]):
        if row == b"\x01":
            out[r] = list(out[r - 1])
            continue
        for p in range(0, len(row), 3):
            slot = (row[p] - 8) * 248 + row[p + 1] - 8
            if slot < width:
                out[r][slot] = row[p + 2]
    return out


@pytest.mark.parametrize("seed", range(6))
def test_holders_matrix_matches_its_row_by_row_definition(seed: int) -> None:
    """The vectorized unpacking of a ``FETCH`` table: two-byte slot codes past 248,
    holders at slots the request did not ask about, repeated and empty rows."""
    from router.index.redis_read import _matrix

    rng = random.Random(seed)
    width = rng.choice([2, 9, 65, 300])
    n = rng.randint(1, 60)
    nread = rng.randint(1, n)
    rows: list[bytes] = []
    for r in range(nread):
        if r and rng.random() < 0.3:
            rows.append(b"\x01")
            continue
        slots = rng.sample(range(width + 20), rng.randint(0, min(12, width)))
        rows.append(b"".join(bytes((8 + s // 248, 8 + s % 248, rng.randint(1, 7))) for s in slots))
    blob = b"\0".join(rows)
    assert _matrix(n, width, nread, blob).tolist() == _matrix_by_rows(n, width, nread, blob)
