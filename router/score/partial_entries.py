"""Score-time lookup of vLLM partial entries that ingest could not key.

Why: with partial-hash hits vLLM registers the prompt's last hash-unit boundary inside
a block as a one-unit entry whose parent is a unit of that block no event carries, so
ingest cannot compute its key and holds it by engine hash
(``router.ingest.partials``). A request that reaches such an entry does carry the
missing tokens: hashing the request's units the engine's way (vLLM's chain at the hash
unit, ``schemas.hashing``: sha256 or sha256_cbor from the default ``NONE_HASH`` seed,
which vLLM uses for cryptographic algorithms when ``PYTHONHASHSEED`` is unset) names
each unit by the engine hash the entry was stored under. The wire carries only the low
64 bits of a digest, so the chain is always computed from the request's first token.

Cost: one sha256 per request unit up to the block after the worker's run of whole
blocks (where vLLM looks for a partial entry), only for workers holding waiting
entries, and the digests are cached by the router's own unit key (a follow-up turn
hashes only its new units). The overlay is a read-only view: matched entries set their
medium bit in the group's per-unit mask of that request's snapshot.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from router.index.base import IndexBackend, WorkerSnapshot
from router.ingest.block_keys import request_keys
from router.ingest.partials import PendingPartials, active_workers, waiting_partials
from schemas.hashing import HASH_ALGOS, NONE_HASH_SEED, external_hash, hash_block
from schemas.hit_rule import FULL_KINDS

# worker id -> [(group, unit index, medium bits)] the request reaches
Overlay = dict[str, list[tuple[int, int, int]]]

DIGEST_CACHE = 65536  # unit digests kept (about 100 bytes each)


class EngineChains:
    """vLLM's unit digests of requests, cached by (algorithm, LoRA key, router unit key):
    the router key names the same prefix (tokens, LoRA name, salt) the digest hashes."""

    def __init__(self, cap: int = DIGEST_CACHE) -> None:
        self._cap = cap
        self._cache: OrderedDict[tuple[Any, ...], bytes] = OrderedDict()

    def external(
        self,
        algo: str,
        token_ids: Sequence[int],
        unit: int,
        lora_key: tuple[Any, ...] | None,
        cache_salt: str | None,
        router_keys: Sequence[int],
    ) -> list[int]:
        """The engine hash (as published) of each of the request's full units."""
        cache = self._cache
        out: list[int] = []
        parent: bytes | None = None
        for j, rkey in enumerate(router_keys):
            ck = (algo, lora_key, rkey)
            digest = cache.get(ck)
            if digest is None:
                extra = _unit_extra_keys(j, lora_key, cache_salt)
                tokens = token_ids[j * unit : (j + 1) * unit]
                digest = cache[ck] = hash_block(parent, tokens, extra, algo, seed=NONE_HASH_SEED)
            parent = digest
            out.append(external_hash(digest))
        while len(cache) > self._cap:
            cache.popitem(last=False)
        return out


def _unit_extra_keys(
    j: int, lora_key: tuple[Any, ...] | None, cache_salt: str | None
) -> tuple[Any, ...] | None:
    """vLLM's extra keys of unit ``j`` (LoRA on every unit, then the salt on the first)."""
    keys: list[Any] = []
    if lora_key is not None:
        keys.append(lora_key)
    if cache_salt and j == 0:
        keys.append(("cache_salt", cache_salt))
    return tuple(keys) if keys else None


_CHAINS = EngineChains()


class PartialLookup:
    """One request's lookup of waiting entries, for the workers that have some."""

    def __init__(
        self,
        index: IndexBackend,
        workers: list[str],
        token_ids: Sequence[int],
        lora_name: str | None,
        cache_salt: str | None,
        chains: EngineChains,
    ) -> None:
        self.index = index
        self.workers = workers
        self.token_ids = token_ids
        self.lora_name = lora_name
        self.cache_salt = cache_salt
        self.chains = chains
        self._memo: dict[tuple[Any, ...], list[int]] = {}

    @classmethod
    def open(
        cls,
        index: IndexBackend,
        worker_ids: Sequence[str],
        token_ids: Sequence[int],
        lora_name: str | None = None,
        cache_salt: str | None = None,
        chains: EngineChains = _CHAINS,
    ) -> PartialLookup | None:
        """None (a dict lookup) unless one of ``worker_ids`` has waiting entries."""
        active = active_workers(index)
        if not active:
            return None
        workers = [w for w in worker_ids if w in active]
        if not workers:
            return None
        return cls(index, workers, token_ids, lora_name, cache_salt, chains)

    def apply(self, snaps: dict[str, WorkerSnapshot | None]) -> None:
        """Add the waiting entries each worker's snapshot can reach to its masks."""
        found: Overlay = {}
        for wid in self.workers:
            snap = snaps.get(wid)
            if snap is None or not snap.hash_unit:
                continue
            limit = _units_needed(snap, len(self.token_ids))
            for pend in waiting_partials(self.index, wid):
                if pend.unit == snap.hash_unit:
                    found.setdefault(wid, []).extend(self._match(pend, limit))
        overlay(snaps, found)

    def _match(self, pend: PendingPartials, limit: int) -> list[tuple[int, int, int]]:
        unit = pend.unit
        assert unit is not None
        lora_key = None
        if self.lora_name is not None:
            lora_key = pend.lora_keys.get(self.lora_name)
            if lora_key is None:  # no waiting entry of this adapter
                return []
        for algo in (pend.algo,) if pend.algo else HASH_ALGOS:
            hashes = self._hashes(algo, unit, lora_key, limit)
            found = [
                (g, j, bit)
                for j, h in enumerate(hashes)
                if (slots := pend.slots(h))
                for (g, bit), n in slots.items()
                if n > 0
            ]
            if found:
                pend.algo = algo
                return found
        return []

    def _hashes(
        self, algo: str, unit: int, lora_key: tuple[Any, ...] | None, limit: int
    ) -> list[int]:
        """The engine hashes of the request's first ``limit`` units (memoised)."""
        mk = (algo, unit, lora_key)
        got = self._memo.get(mk)
        if got is None or len(got) < limit:
            toks = self.token_ids
            rkeys = request_keys(toks[: limit * unit], unit, self.lora_name, self.cache_salt)
            got = self._memo[mk] = self.chains.external(
                algo, toks, unit, lora_key, self.cache_salt, rkeys
            )
        return got[:limit]


def _units_needed(snap: WorkerSnapshot, n: int) -> int:
    """How many of the request's units a waiting entry can matter at: up to the block
    after the run of whole blocks the fine full-attention groups hold (vLLM looks for a
    partial entry there only, ``schemas.hit_rule.fine_reach``); every unit without such
    a group."""
    unit = snap.hash_unit or 1
    cap = max(n - 1, 0) // unit
    need: int | None = None
    for g, meta in snap.groups.items():
        if meta.block_units <= 1 or meta.kind not in FULL_KINDS:
            continue
        k = meta.block_units
        mask = snap.masks.get(g, b"")
        blocks, top = 0, min(cap, len(mask)) // k
        while blocks < top and mask[blocks * k + k - 1]:
            blocks += 1
        reach = min(blocks * k + k - 1, cap)
        need = reach if need is None else min(need, reach)
    return cap if need is None else need


def overlay(snaps: dict[str, WorkerSnapshot | None], found: Overlay) -> None:
    """Set the matched entries' medium bits in the per-unit masks of fine-grained groups
    (vLLM's partial-hash hits; a group not indexed per unit cannot hold them)."""
    for wid, entries in found.items():
        snap = snaps.get(wid)
        if snap is None:
            continue
        for g, j, bit in entries:
            meta = snap.groups.get(g)
            if meta is None or meta.block_units <= 1 or meta.block_size != snap.hash_unit:
                continue
            lst = bytearray(snap.masks.get(g, b""))
            if len(lst) <= j:
                lst.extend(bytes(j + 1 - len(lst)))
            lst[j] |= bit
            snap.masks[g] = bytes(lst)
