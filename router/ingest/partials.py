"""vLLM partial entries whose key is not known yet, held by engine hash.

Why: with partial-hash hits vLLM stores the prompt's last hash-unit boundary inside a
block as a one-unit entry in *every* group, chained to a unit of that block that no
event carries (``KeyPlanner._partial_inside``). Its key becomes known when another store
names the same engine hash -- typically the full-attention group's re-store of the entry
after the block filled and was promoted, which carries the block's tokens -- but the
other groups' copies are never sent again. So a copy that could not be keyed waits here
(per worker, bounded) and is stored as soon as the map knows its hash; a removal that
comes first takes the waiting copy instead. Meanwhile the scorer finds waiting copies by
the engine's own hash of the request's units (``router.score.partial_entries``), so a
waiting copy is served, not lost: only one pushed out by the bound is counted in
``partial_unknown_prefix``.

The scorer reaches the waiting copies through ``waiting_partials(index)``: every
``Ingestor`` of an index registers its per-worker tables there (in this process; a
router replica that does not ingest a worker does not see them and under-estimates).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator, Sequence
from typing import Any
from weakref import WeakKeyDictionary

from router.index.base import BlockKey, EngineHash, IndexBackend, StoreOp
from router.ingest.counters import IngestCounters
from router.ingest.key_planner import KeyPlanner
from schemas import BlockStored

PENDING_CAP = 4096


class PendingPartials:
    """Waiting copies per engine hash: {(group, medium bit): copies}, oldest first, with
    the store that announced them (to place it by its tokens once a later store shows
    its block)."""

    def __init__(
        self,
        counters: IngestCounters,
        cap: int = PENDING_CAP,
        worker: str | None = None,
        active: dict[str, int] | None = None,
    ) -> None:
        self._counters = counters
        self._cap = cap
        # The index's count of non-empty tables per worker (``register``): scorers skip
        # the lookup without touching a table when no worker has waiting entries.
        self._watch = (worker, active) if worker is not None and active is not None else None
        self._on = False
        self._by_hash: OrderedDict[EngineHash, dict[tuple[int, int], int]] = OrderedDict()
        self._events: dict[EngineHash, BlockStored] = {}
        self.unit: int | None = None  # the hash unit the waiting entries were stored at
        # LoRA extra keys the engine hashes with (``("lora", name, path)``), by name:
        # the router is told a request's adapter name only.
        self.lora_keys: dict[str, tuple[Any, ...]] = {}
        self.algo: str | None = None  # the engine's algorithm, once a lookup matched

    def __len__(self) -> int:
        return len(self._by_hash)

    def _sync(self) -> None:
        """Keep the index's count of non-empty tables (``active``) in step."""
        on = bool(self._by_hash)
        if on == self._on or self._watch is None:
            return
        self._on = on
        worker, active = self._watch
        n = active.get(worker, 0) + (1 if on else -1)
        if n > 0:
            active[worker] = n
        else:
            active.pop(worker, None)

    def slots(self, h: EngineHash) -> dict[tuple[int, int], int] | None:
        """{(group, medium bit): copies} waiting under engine hash ``h``, or None."""
        return self._by_hash.get(h)

    def add(
        self,
        group: int,
        bit: int,
        ev: BlockStored,
        hashes: Sequence[EngineHash],
        unit: int | None = None,
    ) -> None:
        if unit is not None and unit != self.unit:
            self.clear()
            self.unit = unit
        for item in ev.extra_keys[0] if ev.extra_keys and ev.extra_keys[0] else ():
            if isinstance(item, list | tuple) and len(item) == 3 and item[0] == "lora":
                self.lora_keys[str(item[1])] = ("lora", item[1], item[2])
        for h in hashes:
            slots = self._by_hash.setdefault(h, {})
            slots[(group, bit)] = slots.get((group, bit), 0) + 1
            self._events.setdefault(h, ev)
        while len(self._by_hash) > self._cap:
            h, slots = self._by_hash.popitem(last=False)
            self._events.pop(h, None)
            self._counters.partial_unknown_prefix += sum(slots.values())
        self._sync()

    def place(self, planner: KeyPlanner, known: dict[EngineHash, BlockKey]) -> None:
        """Key the waiting entries whose parent this batch keyed (the partial entry one
        unit before, announced later), or whose unit of tokens this batch's whole blocks
        show (``KeyPlanner.place_partial``); ``ready`` then stores them."""
        if not self._by_hash:
            return
        slots = planner.new_partial_slots()
        progress = True
        while progress:  # a chain of waiting entries keys one link per pass
            progress = False
            for h, ev in list(self._events.items()):
                if h in known:
                    continue
                if ev.parent_block_hash in known:
                    got = planner.key_with_parent(ev)
                elif ev.token_ids[0] in slots:
                    got = planner.place_partial(ev)
                else:
                    continue
                if got is not None:
                    known[h] = got.keys[0]
                    progress = True

    def take_removed(self, group: int, bit: int, hashes: Sequence[EngineHash]) -> list[EngineHash]:
        """The hashes of a removal the index must apply: a waiting copy is taken first
        (the index never held it)."""
        if not self._by_hash:
            return list(hashes)
        rest: list[EngineHash] = []
        for h in hashes:
            slots = self._by_hash.get(h)
            n = slots.get((group, bit), 0) if slots else 0
            if not n:
                rest.append(h)
                continue
            assert slots is not None
            if n > 1:
                slots[(group, bit)] = n - 1
                continue
            del slots[(group, bit)]
            if not slots:
                del self._by_hash[h]
                self._events.pop(h, None)
        self._sync()
        return rest

    def ready(self, known: dict[EngineHash, BlockKey]) -> list[StoreOp]:
        """Store operations for every waiting copy whose hash the map now names."""
        if not self._by_hash:
            return []
        ops: list[StoreOp] = []
        for h in [h for h in self._by_hash if h in known]:
            self._events.pop(h, None)
            for (group, bit), n in self._by_hash.pop(h).items():
                ops += [StoreOp(group, bit, [h], [known[h]])] * n
                self._counters.partial_late += n
        self._sync()
        return ops

    def clear(self) -> None:
        """The worker's entries went (AllBlocksCleared, a new hash unit): so do these."""
        self._by_hash.clear()
        self._events.clear()
        self._sync()


class Waiting:
    """An index's waiting copies: the per-worker tables of every Ingestor writing to it,
    and how many of them are non-empty per worker (what a scorer checks first)."""

    def __init__(self) -> None:
        self.tables: list[dict[str, PendingPartials]] = []
        self.active: dict[str, int] = {}


_REGISTRY: WeakKeyDictionary[IndexBackend, Waiting] = WeakKeyDictionary()


def register(index: IndexBackend, tables: dict[str, PendingPartials]) -> dict[str, int]:
    """Make an Ingestor's waiting copies visible to scorers of the same index; returns
    the count of non-empty tables per worker its tables keep up to date."""
    waiting = _REGISTRY.get(index)
    if waiting is None:
        waiting = _REGISTRY[index] = Waiting()
    waiting.tables.append(tables)
    return waiting.active


def active_workers(index: IndexBackend) -> dict[str, int]:
    """Workers with waiting copies (usually none): a dict lookup per call."""
    waiting = _REGISTRY.get(index)
    return waiting.active if waiting is not None else {}


def waiting_partials(index: IndexBackend, worker_id: str) -> Iterator[PendingPartials]:
    """The non-empty tables of waiting copies for ``worker_id``."""
    waiting = _REGISTRY.get(index)
    if waiting is None or worker_id not in waiting.active:
        return
    for tables in waiting.tables:
        got = tables.get(worker_id)
        if got:
            yield got
