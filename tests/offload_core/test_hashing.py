"""schemas.hashing reproduces vLLM 0.33's block hashes byte for byte."""

from __future__ import annotations

import hashlib
import json
import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cbor2
import pytest

from offload_core import hashing
from schemas.hashing import (
    block_extra_keys,
    block_hashes,
    external_hash,
    hash_block,
    none_hash,
)

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "vllm-0.33" / "hashes.json"
DATA: dict[str, Any] = json.loads(FIXTURE.read_text())
CASES: list[dict[str, Any]] = DATA["cases"]


def _case_id(case: dict[str, Any]) -> str:
    salt = "salt" if case["extra_keys_first_block"] else "nosalt"
    return f"{case['algo']}-{case['tokens']}-b{case['block_size']}-{salt}"


@pytest.fixture(autouse=True)
def _clean_none_hash(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The fixtures were captured without PYTHONHASHSEED; none_hash caches per process."""
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    none_hash.cache_clear()
    yield
    none_hash.cache_clear()


def test_fixture_covers_both_algos_and_salt() -> None:
    assert {c["algo"] for c in CASES} == {"sha256", "sha256_cbor"}
    assert any(c["extra_keys_first_block"] for c in CASES)
    assert any(not c["extra_keys_first_block"] for c in CASES)


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_block_hashes_match_vllm(case: dict[str, Any]) -> None:
    tokens = DATA["token_sequences"][case["tokens"]]
    extra = case["extra_keys_first_block"]
    salt = None
    if extra is not None:
        assert extra[0] == "cache_salt"
        salt = extra[1]
    digests = block_hashes(tokens, case["block_size"], algo=case["algo"], cache_salt=salt)
    assert [d.hex() for d in digests] == [b["digest_hex"] for b in case["blocks"]]
    assert [external_hash(d) for d in digests] == [b["external_int"] for b in case["blocks"]]
    assert none_hash(case["algo"]).hex() == case["none_hash_hex"]


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_salt_is_an_extra_key_on_the_first_block_only(case: dict[str, Any]) -> None:
    """Chain by hand with hash_block: the salt is ``(("cache_salt", salt),)`` on block 0."""
    tokens = DATA["token_sequences"][case["tokens"]]
    b = case["block_size"]
    extra = case["extra_keys_first_block"]
    parent: bytes | None = None
    for i, expected in enumerate(case["blocks"]):
        keys = ((extra[0], extra[1]),) if (extra and i == 0) else None
        parent = hash_block(parent, tokens[i * b : (i + 1) * b], keys, algo=case["algo"])
        assert parent.hex() == expected["digest_hex"]


def test_none_hash_is_sha256_of_the_seed() -> None:
    seed = DATA["none_hash_seed"]
    assert none_hash("sha256") == hashlib.sha256(pickle.dumps(seed, protocol=5)).digest()
    canonical = cbor2.dumps(seed, canonical=True)
    assert none_hash("sha256_cbor") == hashlib.sha256(canonical).digest()


@pytest.mark.parametrize("algo", ["sha256", "sha256_cbor"])
def test_pythonhashseed_changes_none_hash(monkeypatch: pytest.MonkeyPatch, algo: str) -> None:
    default = none_hash(algo)
    tokens = list(range(32))
    default_chain = block_hashes(tokens, 16, algo=algo)

    monkeypatch.setenv("PYTHONHASHSEED", "1234")
    none_hash.cache_clear()
    seeded = none_hash(algo)
    assert seeded != default
    assert seeded == hashing.hash_function(algo)("1234")
    seeded_chain = block_hashes(tokens, 16, algo=algo)
    assert all(a != b for a, b in zip(seeded_chain, default_chain, strict=True))
    # An explicit seed models an engine whose seed is known, whatever this process has.
    assert none_hash(algo, seed="1234") == seeded
    assert none_hash(algo, seed=DATA["none_hash_seed"]) == default


def test_external_hash_is_low_64_bits_big_endian() -> None:
    digest = bytes(range(32))
    assert external_hash(digest) == int.from_bytes(bytes(range(24, 32)), "big")
    assert external_hash(b"\xff" * 32) == 2**64 - 1


def test_lora_enters_every_block_and_salt_only_the_first() -> None:
    assert block_extra_keys(0) is None
    assert block_extra_keys(0, cache_salt="s") == (("cache_salt", "s"),)
    assert block_extra_keys(1, cache_salt="s") is None
    assert block_extra_keys(3, lora=("a", "/p")) == (("lora", "a", "/p"),)
    assert block_extra_keys(0, "s", ("a", "/p")) == (("lora", "a", "/p"), ("cache_salt", "s"))

    tokens = list(range(48))
    plain = block_hashes(tokens, 16)
    lora = block_hashes(tokens, 16, lora=("adapter", "/models/a"))
    assert all(a != b for a, b in zip(plain, lora, strict=True))
    parent: bytes | None = None
    for i in range(3):
        parent = hash_block(
            parent, tokens[i * 16 : (i + 1) * 16], (("lora", "adapter", "/models/a"),)
        )
        assert parent == lora[i]


def test_partial_block_is_not_hashed_and_prefixes_share_hashes() -> None:
    tokens = list(range(100))
    assert len(block_hashes(tokens, 16)) == 6
    assert block_hashes(tokens[:64], 16) == block_hashes(tokens, 16)[:4]
    assert block_hashes(tokens[:15], 16) == []


def test_bad_arguments_raise_value_error() -> None:
    with pytest.raises(ValueError):
        block_hashes([1, 2, 3], 0)
    with pytest.raises(ValueError):
        block_hashes([1, 2, 3], 1, algo="xxhash")
