"""The storage vocabulary of the router's prefix index and the backend ABC.

The index key is always (worker, group, block key) with a per-block bitmask of the media
holding it. Block keys are the router's *canonical* chain keys (``router.ingest.block_keys``); the
engine's own wire hashes only reach the index through a per-(worker, block size) map
engine hash -> key, used to resolve removals, parents and token-less (offloaded) stores.

Why one coarse ``apply`` per batch instead of per-block calls: the ingest target is
hundreds of thousands of block events per second, so the write side hands a backend one
list of already-hashed operations per batch (one Redis round trip), and the read side asks
for every worker's membership in one ``fetch`` (one Redis round trip).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

import msgspec

from schemas.hit_rule import GroupSpec
from schemas.wire import MEDIUM_CPU, MEDIUM_GPU, MEDIUM_STORAGE

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import NDArray

# Media as bits of one small int per block: cheap to store, OR together and test.
GPU_BIT = 1
CPU_BIT = 2
STORAGE_BIT = 4
MEDIUM_BITS: dict[str, int] = {
    MEDIUM_GPU: GPU_BIT,
    MEDIUM_CPU: CPU_BIT,
    MEDIUM_STORAGE: STORAGE_BIT,
}
BIT_MEDIA: tuple[tuple[int, str], ...] = tuple((b, m) for m, b in MEDIUM_BITS.items())
# What a cached block is worth by the best tier holding it (a CPU block costs a load, a
# STORAGE block a slower one); ``tier_weights`` in the settings overrides these.
DEFAULT_TIER_WEIGHTS: dict[str, float] = {MEDIUM_GPU: 1.0, MEDIUM_CPU: 0.8, MEDIUM_STORAGE: 0.5}

HASH_MODES = ("unknown", "engine", "canonical")

# An engine's wire hash (low-64 int or digest bytes) and the router's canonical key.
EngineHash = int | bytes
BlockKey = int


class IndexUnavailable(Exception):
    """The index backend cannot be reached (Redis down); the API answers 503."""


class GroupMeta(msgspec.Struct, frozen=True, array_like=True):
    """What was learned about one (worker, group) from its events."""

    kind: str
    block_size: int
    sliding_window: int | None = None
    # > 1: a full-attention group indexed per hash unit (``block_size``) whose engine
    # blocks span this many units (vLLM's partial-hash hits; ``schemas.hit_rule``).
    block_units: int = 1

    def spec(self) -> GroupSpec:
        return GroupSpec(self.kind, self.block_size, self.sliding_window, self.block_units)

    @property
    def rule(self) -> str:
        return self.spec().rule


class StoreOp(NamedTuple):
    """Blocks entering ``medium_bit`` in ``group``; ``keys[i]`` is the key of ``hashes[i]``.

    A backend keeps an existing mapping of an engine hash (first writer wins), so two
    groups of one block size share the map entry and its key object.
    """

    group: int
    medium_bit: int
    hashes: list[EngineHash]
    keys: list[BlockKey]


class RemoveOp(NamedTuple):
    """Blocks leaving ``medium_bit`` in ``group``, named by engine hash (resolved by the map)."""

    group: int
    medium_bit: int
    hashes: list[EngineHash]


class ClearOp(NamedTuple):
    """AllBlocksCleared: every entry and map of the worker goes; metadata stays."""


# ``SeqOp.follows`` values that are not a seq: no predecessor was given (the plain rule
# below), or the writer has applied nothing of the rank since the worker was cleared.
FOLLOWS_ANY = -2
FOLLOWS_NOTHING = -1


class SeqOp(NamedTuple):
    """The ops that follow (up to the next ``SeqOp``) are batch ``seq`` of DP rank
    ``rank``. A backend applies them only if ``seq`` is newer than the last one it
    recorded for the rank, and records it with them, atomically. Why: with copies counted,
    applying a batch twice would double its stores -- a retry, a replay that overlaps, a
    restarted router resuming from the index, or replicas sharing one index all apply a
    batch exactly once this way. ``fingerprint`` (crc32 of the payload) lets a restarted
    router tell the same publisher from a new process that reuses the seq.

    ``follows`` is the seq the writer applied before this one (``FOLLOWS_NOTHING`` right
    after a clear): a newer batch whose predecessor is not the index's last one is
    *deferred* (not applied, not recorded). Why: replicas share the index, and one that
    cleared a worker rebuilds it from the publisher's oldest buffered batch; a live batch
    another replica wrote in between would be recorded first and make the rebuild's older
    batches look applied (and its removals would run before the stores they undo). The
    replica rebuilding applies every batch in order, the deferred ones included."""

    rank: int
    seq: int
    fingerprint: int = 0
    follows: int = FOLLOWS_ANY


def seq_verdict(last: int | None, op: SeqOp) -> int:
    """1 apply, 0 skip (applied already), -1 defer (see ``SeqOp``); ``last`` is the
    rank's last recorded seq. The Redis script (``router.index.redis_lua``) has the same
    rule."""
    if last is not None and op.seq <= last:
        return 0
    f = op.follows
    if f == FOLLOWS_ANY or f == (FOLLOWS_NOTHING if last is None else last):
        return 1
    return -1


Op = StoreOp | RemoveOp | ClearOp | SeqOp


@dataclass
class ApplyResult:
    """What one ``apply`` changed.

    ``stored_repeat`` counts stores of a (group, key, medium) already held: another
    physical copy (vLLM does not de-duplicate), so the entry now has one more copy;
    ``removed`` counts removals of a held copy (the entry goes with its last copy).
    """

    stored: int = 0
    stored_repeat: int = 0
    removed: int = 0
    removed_missing: int = 0
    skipped_batches: int = 0  # SeqOp segments already applied (not applied again)
    deferred_batches: int = 0  # SeqOp segments that do not follow the index's last seq
    # The rank's last recorded seq at the last deferral (-1: none): whether the index
    # moves on while a writer's batches wait (``router.ingest.writer``).
    deferred_at: int = -1

    def add(self, other: ApplyResult) -> None:
        self.stored += other.stored
        self.stored_repeat += other.stored_repeat
        self.removed += other.removed
        self.removed_missing += other.removed_missing
        self.skipped_batches += other.skipped_batches
        self.deferred_batches += other.deferred_batches
        if other.deferred_batches:
            self.deferred_at = other.deferred_at


class EngineSettings(msgspec.Struct, frozen=True, array_like=True):
    """An engine's cache settings that its events do not carry (registration fields).

    ``hash_block_size``: the unit vLLM hashes its one chain at (None: learned as the
    smallest block size a store shows); ``eagle``: EAGLE/MTP drops the last matched
    block; ``partial_hash_hits``: hits align to the hash unit instead of the lcm of the
    groups' block sizes (mamba align with blocks larger than the unit).
    """

    hash_block_size: int | None = None
    eagle: bool = False
    partial_hash_hits: bool = False
    # Clients send ``kv_cache_report_mode: "full"``: hit prefixes are re-announced, and
    # chain starts the index already holds are taken for re-announcements, not copies.
    report_full: bool = False


@dataclass
class WorkerState:
    """A worker's metadata as persisted in the backend.

    ``hash_unit`` is the unit its block keys are chained at (registered or learned);
    a group of block size ``k * hash_unit`` keys its block ``i`` by unit key ``(i+1)k-1``.
    """

    groups: dict[int, GroupMeta] = field(default_factory=dict)
    hash_mode: str = "unknown"
    hash_unit: int | None = None
    settings: EngineSettings = field(default_factory=EngineSettings)

    def copy(self, groups: dict[int, GroupMeta] | None = None) -> WorkerState:
        """A copy that shares no mutable dict (optionally with other groups)."""
        return WorkerState(
            dict(self.groups if groups is None else groups),
            self.hash_mode,
            self.hash_unit,
            self.settings,
        )


@dataclass
class WorkerSnapshot:
    """One worker's membership for one request, as ``fetch`` returns it.

    ``masks[g]`` holds one byte per request block ``0..n-1`` of group ``g``: the media
    bitmask (0 = not cached), truncated after the first miss for full-attention groups
    and after the last hit (never beyond the shortest full-attention prefix) for the
    others. Truncation is exact for the hit rule: a block past the end counts as a miss.
    Bytes, because they are a compact ``Sequence`` the hit rule reads directly and
    ``bytes.translate`` derives the GPU-only view in C. A group whose block size was not
    in ``keys_by_size`` has no entry (the scorer hashes that size and asks again).
    """

    groups: dict[int, GroupMeta]
    masks: dict[int, bytes]
    hash_unit: int | None = None
    settings: EngineSettings = field(default_factory=EngineSettings)


@dataclass
class Columns:
    """Every worker's membership for one request as matrices (``fetch_columns``).

    ``matrices[(g, bs)]`` is a uint8 array of (``len(keys_by_size[bs])`` x slots): the
    media bitmask of each request block in group ``g`` for each worker slot, zero for
    blocks no worker holds (a full-attention-only table may stop after the first such
    block; zeros follow). ``slots[w]`` is worker ``w``'s column. ``cohorts`` groups the
    known workers by identical metadata (one snapshot with empty ``masks`` each);
    ``unknown`` are the workers never seen. Why: the scorer then applies the hit rule to
    all workers of a cohort at once (``router.score.vec``).
    """

    cohorts: list[tuple[WorkerSnapshot, list[str]]]
    unknown: list[str]
    slots: dict[str, int]
    matrices: dict[tuple[int, int], NDArray[np.uint8]]
    width: int = 0  # slots: the matrices' second dimension


@dataclass
class Bits:
    """Every worker's membership as presence bitsets (``fetch_bits``; memory index).

    ``tables[g]`` maps a block key to an int with four bits per slot ``s``: bit ``4s``
    set when slot ``s`` holds the key on some medium, ``4s+1``..``4s+3`` on GPU, CPU,
    STORAGE. A read-only view of the index's own tables: the scorer looks keys up
    itself, so it can stop at the first key no requested worker holds. ``cohorts``
    groups the known workers by identical metadata as (snapshot, [(id, slot)]);
    ``slots`` bounds the slot numbers. Why: an AND of one int per request block
    answers for every worker at once, so a score costs what the prompt's blocks cost,
    not workers x blocks (router.score.bits).
    """

    cohorts: list[tuple[WorkerSnapshot, list[tuple[str, int]]]]
    unknown: list[str]
    tables: dict[int, dict[BlockKey, int]]
    slots: int
    # Per cohort (same order), its members' any-medium bits OR-ed (bit 4s for slot s):
    # computed once with the cohorts, not per score. Empty: the scorer computes them.
    masks: list[int] = field(default_factory=list)


class IndexBackend(ABC):
    """Storage behind the router: entries, the engine-hash map and per-worker metadata.

    Every method may raise ``IndexUnavailable``; none raises for unknown workers.
    """

    kind: str = "abstract"

    @abstractmethod
    async def ping(self) -> bool:
        """True when the backend answers (``/readyz``)."""

    @abstractmethod
    async def close(self) -> None:
        """Release connections; the object is unusable afterwards."""

    @abstractmethod
    async def stats(self) -> dict[str, int | float | str]:
        """``workers``, ``entries`` ((worker, group, block) entries), ``map_entries`` and a
        ``bytes`` estimate (memory: tracemalloc-calibrated; redis: used_memory)."""

    @abstractmethod
    async def load_worker(self, worker_id: str) -> WorkerState | None:
        """The persisted metadata of a worker, or None when it was never seen."""

    @abstractmethod
    async def save_worker(self, worker_id: str, state: WorkerState) -> None:
        """Persist a worker's metadata (creates the worker if needed)."""

    @abstractmethod
    async def known_workers(self) -> list[str]:
        """Every worker with persisted metadata, sorted."""

    @abstractmethod
    async def resolve(
        self,
        worker_id: str,
        block_size: int,
        hashes: Sequence[EngineHash],
        *,
        live_only: bool = False,
    ) -> list[BlockKey | None]:
        """Map engine hashes to block keys (None where the map does not know the hash).
        ``live_only``: only blocks some group holds now (no mappings of removed blocks)."""

    @abstractmethod
    async def apply(
        self, worker_id: str, groups: dict[int, GroupMeta], ops: Sequence[Op]
    ) -> ApplyResult:
        """Apply ``ops`` in order. ``groups`` is the worker's full group metadata (every
        group an op names must be in it). Entries count copies per
        (worker, group, key, medium): a store adds one, a removal takes one, and the
        medium's bit goes with the last copy; a key whose mask drops to 0 is deleted,
        and its map entry too once no group of that block size holds the key."""

    async def apply_many(
        self, items: Sequence[tuple[str, dict[int, GroupMeta], Sequence[Op]]]
    ) -> list[ApplyResult]:
        """``apply`` for several (worker, groups, ops) in order; a backend may send them
        in one round trip (redis pipelines them)."""
        return [await self.apply(w, groups, ops) for w, groups, ops in items]

    @abstractmethod
    async def clear_worker(self, worker_id: str) -> None:
        """Drop the worker's entries, maps and applied seqs; keep its metadata."""

    @abstractmethod
    async def save_registration(self, worker_id: str, spec: bytes) -> None:
        """Keep a REST registration (JSON) so a restarted router registers it again."""

    @abstractmethod
    async def delete_registration(self, worker_id: str) -> None:
        """Forget a registration (``DELETE /v1/workers/{id}``)."""

    @abstractmethod
    async def load_registrations(self) -> dict[str, bytes]:
        """Every kept registration, by worker id."""

    @abstractmethod
    async def load_seqs(self, worker_id: str) -> dict[int, tuple[int, int]]:
        """Per DP rank, the last applied (seq, fingerprint) ``SeqOp`` recorded."""

    @abstractmethod
    async def remove_worker(self, worker_id: str) -> None:
        """Drop entries, maps and metadata; work proportional to the worker's blocks."""

    @abstractmethod
    async def group_counts(self, worker_id: str) -> dict[int, dict[str, int]]:
        """Per group, the number of blocks on each medium (``blocks_by_medium``)."""

    @abstractmethod
    async def copies(
        self, worker_id: str, group: int, keys: Sequence[BlockKey], medium_bit: int = GPU_BIT
    ) -> list[int]:
        """How many copies of each key ``group`` holds on the medium (0: not held) --
        what tells a re-announced hit from a new copy (``router.ingest.reannounce``)."""

    @abstractmethod
    async def fetch(
        self, worker_ids: Sequence[str], keys_by_size: dict[int, Sequence[BlockKey]]
    ) -> dict[str, WorkerSnapshot | None]:
        """Membership of the request's blocks for every worker, in one backend call.

        ``keys_by_size[b]`` are the request's block keys for block size ``b``. A worker
        never seen maps to None.
        """

    async def fetch_columns(
        self, worker_ids: Sequence[str], keys_by_size: dict[int, Sequence[BlockKey]]
    ) -> Columns | None:
        """``fetch`` as matrices, when the backend holds them that way (None: use
        ``fetch``)."""
        return None

    async def fetch_bits(self, worker_ids: Sequence[str]) -> Bits | None:
        """The workers' cohorts and the presence bitset tables, when the backend keeps
        them (None: use ``fetch_columns`` / ``fetch``)."""
        return None
