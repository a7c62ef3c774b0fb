"""SGLang's page-hash chain as ``router.ingest.sglang_keys`` computes it, and hash-mode
detection in the ingestor. The chain itself is checked block by block against SGLang's
recorded events in ``tests/conformance/test_sglang_recordings.py``; here the edges."""

from __future__ import annotations

import hashlib
import struct

import pytest

from router.index import make_index
from router.ingest.ingestor import Ingestor
from router.ingest.sglang_keys import (
    detect_sglang_hash,
    event_hash,
    page_digests,
    request_block_hashes,
    salt_seed,
)
from schemas import BlockStored, KVEventBatch


def test_first_page_is_sha256_of_u32_le_tokens() -> None:
    digest = hashlib.sha256(struct.pack("<3I", 1, 2, 70000)).digest()
    assert page_digests([1, 2, 70000], 3) == [digest]
    assert event_hash(digest) == int.from_bytes(digest[:8], "big", signed=True)


def test_wide_tokens_switch_the_page_to_tagged_u64() -> None:
    wide = 2**33
    digest = hashlib.sha256(b"\xff" + struct.pack("<2Q", 5, wide)).digest()
    assert page_digests([5, wide], 2) == [digest]
    with pytest.raises(ValueError):
        page_digests([-1], 1)


def test_ids_above_int64_are_refused_as_sglangs_hasher_refuses_them() -> None:
    # SGLang 0.5.23 hash_binding.cpp takes ids as int64 ("token id must be a non-negative
    # int64"); only ids up to 2**63-1 take the tagged u64 form.
    top = 2**63 - 1
    assert page_digests([5, top], 2) == [
        hashlib.sha256(b"\xff" + struct.pack("<2Q", 5, top)).digest()
    ]
    for bad in (2**63, 2**64 - 1):
        with pytest.raises(ValueError):
            page_digests([5, bad], 2)
        with pytest.raises(ValueError):
            request_block_hashes([bad], 1)
        # a chain SGLang cannot publish is never taken for SGLang's own hashing
        forged = event_hash(hashlib.sha256(b"\xff" + struct.pack("<Q", bad)).digest())
        assert not detect_sglang_hash(forged, [bad])


def test_salt_seeds_the_chain_and_empty_salt_is_none() -> None:
    seed = hashlib.sha256(b"sglang-cache-salt-v1\0tenant").digest()
    assert salt_seed("tenant") == seed
    assert salt_seed("") is None and salt_seed(None) is None
    salted = request_block_hashes([1, 2, 3, 4, 5], 2, "tenant")
    assert len(salted) == 2
    assert salted != request_block_hashes([1, 2, 3, 4, 5], 2)


def test_detection_accepts_signed_and_unsigned_readings_only_of_the_right_chain() -> None:
    (h,) = request_block_hashes([9, 8, 7, 6], 4, "s")
    assert detect_sglang_hash(h, [9, 8, 7, 6], "s")
    assert detect_sglang_hash(h & (2**64 - 1), [9, 8, 7, 6], "s")
    assert not detect_sglang_hash(h, [9, 8, 7, 6])  # salt missing
    assert not detect_sglang_hash(h + 1, [9, 8, 7, 6], "s")
    assert not detect_sglang_hash(b"\x00" * 32, [9, 8, 7, 6], "s")


def _store(hashes: list[int], tokens: list[int], **kw: object) -> BlockStored:
    return BlockStored(
        block_hashes=[*hashes],
        parent_block_hash=None,
        token_ids=tokens,
        block_size=2,
        lora_id=None,
        medium=kw.pop("medium", "GPU"),  # type: ignore[arg-type]
        lora_name=kw.pop("lora_name", None),  # type: ignore[arg-type]
        **kw,  # type: ignore[arg-type]
    )


@pytest.mark.parametrize(
    ("first", "mode"),
    [
        ({"salt": "t", "lora_name": None, "real": True}, "engine"),
        ({"salt": None, "lora_name": None, "real": False}, "canonical"),
        ({"salt": None, "lora_name": "adapter", "real": False}, "unknown"),
    ],
)
async def test_ingestor_reports_sglang_hashing_as_engine_mode(
    first: dict[str, object], mode: str
) -> None:
    toks = [11, 12, 13, 14]
    salt = first["salt"]
    hashes = request_block_hashes(toks, 2, salt) if first["real"] else [1, 2]  # type: ignore[arg-type]
    ev = _store(hashes, toks, cache_salt=salt, lora_name=first["lora_name"], medium="CPU_PINNED")
    ingestor = Ingestor(make_index("memory"))
    await ingestor.apply_batch("w", KVEventBatch(0.0, [ev]))
    assert await ingestor.hash_mode("w") == mode
    assert ingestor.counters.bad_events == 0
    groups = await ingestor.worker_groups("w")
    assert groups[0].blocks_by_medium == {"CPU": 2}
