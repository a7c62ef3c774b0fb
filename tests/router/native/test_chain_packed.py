"""The core's packed-token helpers (router/native/chain_packed.c) against msgspec and
``chain``: every msgpack int width, int32 edges, and what they must refuse."""

from __future__ import annotations

import random

import msgspec
import pytest

from router import native

pytestmark = pytest.mark.skipif(
    not native.available() or not hasattr(native._core, "chain_packed"),
    reason="compiled core (with libxxhash) not built",
)
core = native._core

# Values that msgpack encodes in each int form: fixint, negative fixint, (u)int8/16/32/64.
EDGES = [0, 1, 127, 128, 255, 256, 65535, 65536, 2**31 - 1, -1, -32, -33, -128, -129]
EDGES += [-32768, -32769, -(2**31)]


def test_chain_packed_equals_chain_over_the_ints() -> None:
    rng = random.Random(4)
    for _ in range(300):
        bs = rng.choice([1, 4, 16, 32])
        n = rng.randrange(0, 20)
        toks = [
            rng.choice([rng.choice(EDGES), rng.randrange(150_000), rng.randrange(-(2**31), 2**31)])
            for _ in range(n * bs + rng.randrange(3))
        ]
        raw = msgspec.msgpack.encode(toks)
        assert core.packed_len(raw) == len(toks)
        assert core.packed_len(raw, False) == len(toks)
        assert core.chain_packed(7, raw, bs, n) == core.chain(7, toks, bs, n)
        # Raw, as msgspec hands it over, reads the same as bytes.
        wrapped = msgspec.msgpack.decode(msgspec.msgpack.encode([toks]), type=list[msgspec.Raw])
        assert core.chain_packed(7, wrapped[0], bs, n) == core.chain(7, toks, bs, n)
    big = list(range(70_000))  # array32 header, more tokens than the stack buffer
    raw = msgspec.msgpack.encode(big)
    assert core.packed_len(raw) == len(big)
    assert core.chain_packed(1, raw, 16, 4375) == core.chain(1, big, 16, 4375)


@pytest.mark.parametrize(
    "bad", [[2**31], [-(2**31) - 1], [2**63], ["x"], [1.5], [None], [[1]], [b"x"]]
)
def test_non_int32_tokens_are_refused(bad: list[object]) -> None:
    # Last (read by the careful tail loop) and in the middle of uint16/uint32 ids (read
    # by the branch-free loop while 5 bytes are left).
    for toks in ([3] * 15 + bad, [70_000, 300] * 7 + bad + [65_536, 1] * 8):
        raw = msgspec.msgpack.encode(toks)
        assert core.packed_len(raw) == -1
        assert core.chain_packed(1, raw, 16, 1) is None


def test_uint32_over_int32_is_refused_anywhere() -> None:
    for at in range(12):
        toks: list[int] = [70_000] * 12
        toks[at] = 2**32 - 1
        raw = msgspec.msgpack.encode(toks)
        assert core.packed_len(raw) == -1, at


def test_not_an_array_or_too_short() -> None:
    assert core.packed_len(msgspec.msgpack.encode({"a": 1})) == -1
    assert core.packed_len(b"") == -1
    assert core.packed_len(b"\x92\x01") == -1  # truncated
    assert core.packed_len(b"\x91\x01\x01") == -1  # trailing bytes
    assert core.chain_packed(1, msgspec.msgpack.encode([1, 2]), 2, 2) is None  # fewer tokens
    with pytest.raises(ValueError):
        core.chain_packed(1, msgspec.msgpack.encode([1, 2]), 0, 1)
