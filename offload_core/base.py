"""The vocabulary of KV offloading: keys, request context, specs, events, the manager ABC.

Everything a caller (the scheduler, the engine, the transfer worker) needs to talk to an
offloading backend lives here, so one file teaches the whole contract and backends
(``offload_core.cpu``, ...) depend on it, never the other way round. No torch.

Protocol, per request and per batch of block keys:

* **load** -- ``lookup`` each key (in order, stop at the first miss), then
  ``prepare_load`` (pins the blocks), let the transfer worker copy them, then
  ``complete_load`` (unpins). ``touch`` records the use for the eviction policy.
* **store** -- ``prepare_store`` picks destinations (evicting if needed), the transfer
  worker copies, then ``complete_store(success=...)`` makes them visible (or frees them).
* ``take_events`` drains what changed, for the KV event publisher.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, NewType

# An offload key is ``block_hash + group_idx.to_bytes(4, "big")``. Compact ``bytes`` were
# chosen over ``(hash, group)`` tuples on purpose: the hot paths keep many long-lived keys
# in dicts and lists, and bytes are invisible to the cyclic GC while tuples are tracked when
# created (building 200k tuple keys ran 262 gen-0 collections here, bytes keys none); dict
# look-ups with fresh bytes keys were 1.1-1.2x faster (benchmarks/offload_manager.py).
OffloadKey = NewType("OffloadKey", bytes)

GROUP_IDX_BYTES = 4
_MAX_GROUP_IDX = (1 << (8 * GROUP_IDX_BYTES)) - 1
_GROUP_SUFFIX: dict[int, bytes] = {}  # group_idx -> its 4 bytes, filled on first use


def make_offload_key(block_hash: bytes, group_idx: int) -> OffloadKey:
    """Pack a block hash and its KV cache group into one key.

    The group is part of the key because groups of equal block size carry the *same*
    hashes: a block's identity is (group, hash), never the hash alone.
    """
    suffix = _GROUP_SUFFIX.get(group_idx)
    if suffix is None:
        if not 0 <= group_idx <= _MAX_GROUP_IDX:
            raise ValueError(f"group_idx {group_idx} out of range [0, {_MAX_GROUP_IDX}]")
        suffix = group_idx.to_bytes(GROUP_IDX_BYTES, "big")
        if len(_GROUP_SUFFIX) < 1024:
            _GROUP_SUFFIX[group_idx] = suffix
    if type(block_hash) is not bytes:
        block_hash = bytes(block_hash)
    return OffloadKey(block_hash + suffix)


def get_offload_block_hash(key: OffloadKey) -> bytes:
    """The block hash (digest) part of ``key``."""
    return key[:-GROUP_IDX_BYTES]


def get_offload_group_idx(key: OffloadKey) -> int:
    """The KV cache group index part of ``key``."""
    return int.from_bytes(key[-GROUP_IDX_BYTES:], "big")


@dataclass(slots=True)
class ReqContext:
    """Per-request information handed to every manager call.

    ``kv_transfer_params`` carries the request's connector parameters (as vLLM passes
    them through its API), letting a backend decide per request, e.g. to skip storing.
    """

    kv_transfer_params: dict[str, Any] | None = None


class LoadStoreSpec(ABC):
    """Where blocks live in one medium: what the transfer worker needs to copy them."""

    @staticmethod
    @abstractmethod
    def medium() -> str:
        """The medium's name as published in KV events (``"GPU"``, ``"CPU"``, ...)."""


@dataclass(slots=True)
class PrepareStoreOutput:
    """The result of ``OffloadingManager.prepare_store``.

    ``keys_to_store`` are the keys the caller must copy (a subset of those asked, in the
    same order: keys already stored or being stored are left out); ``store_spec`` gives
    their destinations, index-aligned with ``keys_to_store``; ``evicted_keys`` were
    dropped to make room and are no longer loadable.
    """

    keys_to_store: list[OffloadKey]
    store_spec: LoadStoreSpec
    evicted_keys: list[OffloadKey] = field(default_factory=list)


@dataclass(slots=True)
class OffloadingEvent:
    """Keys that became available (``removed=False``) or went away in ``medium``."""

    keys: list[OffloadKey]
    medium: str
    removed: bool


class OffloadingManager(ABC):
    """The scheduler-side bookkeeping of one offloading medium.

    It owns no data: it decides where blocks go and tracks what is present, ready and
    in use; a transfer worker moves the bytes. Methods are called from one thread (the
    scheduler's) and never block.
    """

    @abstractmethod
    def lookup(self, key: OffloadKey, ctx: ReqContext) -> bool | None:
        """Whether one block is stored *and ready* to be loaded.

        Returns True if ``prepare_load`` may be called for it now, False if it is absent
        or still being stored, and None if the answer is not known yet (e.g. a remote
        medium still being queried): the caller should retry later, typically by
        deferring the request, and must not treat None as a miss or a hit.
        """

    @abstractmethod
    def prepare_load(self, keys: Sequence[OffloadKey], ctx: ReqContext) -> LoadStoreSpec:
        """Pin ``keys`` for loading and say where they are.

        Every key must have been reported ready by ``lookup``; otherwise this raises
        (``KeyError`` or ``ValueError``) and pins nothing. Pinned blocks are never
        evicted until the matching ``complete_load``. The spec is index-aligned with
        ``keys``. A key may be prepared by several requests at once (pins count).
        """

    @abstractmethod
    def touch(self, keys: Sequence[OffloadKey], ctx: ReqContext) -> None:
        """Record a use of ``keys`` for the eviction policy.

        Keys earlier in the sequence are treated as older uses, so a request's prefix
        order leaves its last block most recent. Unknown keys are ignored.
        """

    @abstractmethod
    def complete_load(self, keys: Sequence[OffloadKey], ctx: ReqContext) -> None:
        """Unpin ``keys`` after their transfer finished (successfully or not).

        Each call undoes exactly one ``prepare_load`` of the same keys. Unpinning a key
        that is not pinned is a caller bug and raises ``ValueError``.
        """

    @abstractmethod
    def prepare_store(
        self, keys: Sequence[OffloadKey], ctx: ReqContext
    ) -> PrepareStoreOutput | None:
        """Reserve room for the keys that are not stored yet, evicting if needed.

        Keys already stored or already being stored are skipped (not in
        ``keys_to_store``). Only unpinned, ready blocks may be evicted, and never one of
        ``keys``. Returns None when there is not enough evictable room for all the new
        keys right now -- nothing is reserved or evicted in that case; the caller may try
        again later. Reserved keys are not visible to ``lookup`` until
        ``complete_store(success=True)``.
        """

    @abstractmethod
    def complete_store(
        self, keys: Sequence[OffloadKey], ctx: ReqContext, success: bool = True
    ) -> None:
        """Finish a store started by ``prepare_store``.

        On success the keys become ready (``lookup`` returns True) and are announced as
        stored; on failure their reservations are freed and nothing is announced. Pass
        exactly the ``keys_to_store`` of the matching ``prepare_store``: a pending key
        carries no owner, so another request's pending key would be completed (or freed)
        too. Keys that are unknown or already ready are ignored.
        """

    @abstractmethod
    def take_events(self) -> Iterable[OffloadingEvent]:
        """Drain the events produced since the last call (oldest first).

        Returns nothing when events are disabled. A key's store is announced once it
        completes and its removal when it is evicted, so replaying the events in order
        reproduces exactly the set of ready keys.
        """
