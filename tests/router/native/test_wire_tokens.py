"""The core's batch rewrite (router/native/wire_tokens.c): every ``token_ids`` array as
one bin of native int32s. Decoded with ``schemas.decode.decode_int32`` it must give
what ``decode_batch`` gives for the original payload, and decline (None) wherever the
packed decode would: ids that are not int32 ints, a token_ids that is not an array,
bytes that are not msgpack."""

from __future__ import annotations

import random
from array import array
from typing import Any

import msgspec
import pytest

from router import native
from router.ingest import packed
from schemas import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch, encode_batch
from schemas.decode import PackedBlockStored, decode_batch, decode_int32

pytestmark = pytest.mark.skipif(
    not native.available() or not hasattr(native._core, "int32_tokens"),
    reason="compiled core (with libxxhash) not built",
)
core = native._core

EDGES = [0, 1, 127, 128, 255, 256, 65535, 65536, 2**31 - 1, -1, -32, -33, -129, -(2**31)]


def _store(rng: random.Random, n_tokens: int, **kw: Any) -> BlockStored:
    toks = [
        rng.choice([rng.choice(EDGES), rng.randrange(150_000), rng.randrange(128)])
        for _ in range(n_tokens)
    ]
    hashes = [rng.getrandbits(64) for _ in range(max(1, n_tokens // 16))]
    return BlockStored(hashes, rng.choice([None, 7]), toks, 16, None, "GPU", None, **kw)


def _same(payload: bytes) -> None:
    """The rewrite decodes to what decode_batch gives, token ids as int32 bytes."""
    got = decode_int32(core.int32_tokens(payload))
    assert got is not None
    want = decode_batch(payload)
    for ev in got.events:
        if type(ev) is PackedBlockStored:
            assert type(ev.token_ids) is bytes
    assert packed.unpack(got) == want


def test_rewrite_decodes_as_decode_batch() -> None:
    rng = random.Random(3)
    # Array headers fix / 16 / 32 bits and bin headers 8 / 16 / 32 bits (63 and 64 ids
    # are 252 and 256 bytes; 16,383 and 16,384 are 65,532 and 65,536).
    for n in [0, 1, 15, 16, 63, 64, 65, 16_383, 16_384, 70_000]:
        _same(encode_batch(KVEventBatch(0.5, [_store(rng, n, group_idx=1)], 0)))
    for i in range(200):
        events: list[Any] = []
        for _ in range(rng.randint(0, 4)):
            kind = rng.random()
            if kind < 0.6:
                kw: dict[str, Any] = {"group_idx": rng.choice([None, 0, 3])}
                if rng.random() < 0.2:
                    kw["lookahead_token_ids"] = [[1, 2, 70_000]]
                if rng.random() < 0.2:
                    kw["extra_keys"] = [[("mm", "x")]]
                events.append(_store(rng, rng.randrange(0, 80), **kw))
            elif kind < 0.9:
                events.append(BlockRemoved([rng.getrandbits(64)], "GPU", rng.choice([None, 1])))
            else:
                events.append(AllBlocksCleared())
        rank = rng.choice([None, 0, 2])
        _same(encode_batch(KVEventBatch(float(i), events, rank)))


@pytest.mark.parametrize("bad", [2**31, 2**32 - 1, -(2**31) - 1, 2**63, "x", 1.5, None, [1]])
def test_ids_that_are_not_int32_decline(bad: Any) -> None:
    rng = random.Random(1)
    for at in (0, 7, 31):
        ev = _store(rng, 32, group_idx=0)
        toks = list(ev.token_ids)
        toks[at] = bad
        payload = msgspec.msgpack.encode(
            KVEventBatch(0.0, [msgspec.structs.replace(ev, token_ids=toks)])
        )
        assert core.int32_tokens(payload) is None
        assert packed.decode(payload) is None  # and the usual decode takes it


def test_token_ids_that_are_not_an_array_decline() -> None:
    base = msgspec.msgpack.encode(
        {"type": "BlockStored", "block_hashes": [1], "parent_block_hash": None}
    )
    for value in (b"\x00" * 64, "tokens", None, 5, {"a": 1}):
        ev = msgspec.msgpack.decode(base)
        ev.update(token_ids=value, block_size=16, lora_id=None, medium="GPU", lora_name=None)
        assert core.int32_tokens(msgspec.msgpack.encode([0.0, [ev]])) is None


def test_other_shapes_pass_through_for_the_decode_to_judge() -> None:
    """Positional (legacy) events and unknown fields are copied: decode_int32 refuses
    them like decode_packed, and packed.decode falls back the same way as before."""
    positional = [0.0, [["BlockStored", [1], None, [5] * 16, 16, None, "GPU", None]]]
    unknown = [0.0, [{"type": "BlockRemoved", "block_hashes": [1], "token_ids": [1, 2]}]]
    for batch in (positional, unknown):
        payload = msgspec.msgpack.encode(batch)
        rewritten = core.int32_tokens(payload)
        assert rewritten is not None and decode_int32(rewritten) is None
        assert packed.decode(payload) is None


def test_truncated_and_garbage_payloads_never_crash() -> None:
    rng = random.Random(9)
    payload = encode_batch(KVEventBatch(1.0, [_store(rng, 40, group_idx=0)] * 2, 0))
    for cut in range(len(payload)):
        got = core.int32_tokens(payload[:cut])
        assert got is None or decode_int32(got) is None
    for _ in range(3000):
        junk = bytes(rng.getrandbits(8) for _ in range(rng.randrange(1, 40)))
        got = core.int32_tokens(b"\x92\xcb" + junk)
        assert got is None or isinstance(got, bytes)
    deep = b"\x92\x00\x91" + b"\x91" * 200 + b"\xc0"  # nesting past the walk's depth limit
    assert core.int32_tokens(deep) is None


def test_chain_int32_equals_chain() -> None:
    rng = random.Random(2)
    for _ in range(100):
        bs = rng.choice([1, 4, 16])
        n = rng.randrange(0, 12)
        toks = [rng.randrange(-(2**31), 2**31) for _ in range(n * bs + rng.randrange(3))]
        ids = array("i", toks).tobytes()
        assert core.chain_int32(11, ids, bs, n) == core.chain(11, toks, bs, n)
    assert core.chain_int32(1, array("i", [1, 2]).tobytes(), 2, 2) is None  # too few ids
    assert core.chain_int32(1, b"\x00" * 7, 1, 1) is None  # not whole int32s


def test_mutated_payloads_decline_or_decode_never_raise() -> None:
    """Bytes flipped, cut and inserted in real payloads (what a corrupt or hostile frame
    looks like): the rewrite answers bytes or None and the packed decode a batch or None,
    never an exception (``make check-native-asan`` runs this under AddressSanitizer)."""
    rng = random.Random(7)
    base = [
        encode_batch(
            KVEventBatch(
                1.0,
                [
                    _store(rng, rng.randrange(0, 70), group_idx=rng.choice([None, 1])),
                    BlockRemoved([5], "GPU"),
                ],
                rng.choice([None, 3]),
            )
        )
        for _ in range(20)
    ]
    for _ in range(3000):
        p = bytearray(rng.choice(base))
        for _ in range(rng.randrange(1, 6)):
            op = rng.random()
            at = rng.randrange(len(p) + 1)
            if op < 0.5 and at < len(p):
                p[at] = rng.getrandbits(8)
            elif op < 0.75:
                del p[at:]
            else:
                p[at:at] = bytes(rng.getrandbits(8) for _ in range(rng.randrange(1, 8)))
        got = core.int32_tokens(bytes(p))
        assert got is None or isinstance(got, bytes)
        batch = packed.decode(bytes(p))
        assert batch is None or isinstance(batch, KVEventBatch)
