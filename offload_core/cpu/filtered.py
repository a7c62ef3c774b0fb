"""Store only blocks that were offered for storage repeatedly (vLLM's ``store_threshold``).

Offloading a block costs a device-to-host copy and pushes an older block out of the CPU
tier; a block offered once (a one-shot prompt) is rarely worth it. vLLM 0.33's CPU
offloading takes ``store_threshold`` and ``max_tracker_size`` from
``kv_connector_extra_config``: it counts how often each block is *offered* to
``prepare_store`` and stores a new block only from its ``store_threshold``-th offer on
(values below 2 disable the filter). Blocks already on the tier are never filtered.
This wrapper gives any ``OffloadingManager`` the same rule, so the simulated engine
(``kvroute engine --cpu-store-threshold N``) fills its CPU tier the way vLLM does.

The counter is bounded like vLLM's: an LRU table of at most ``max_tracker_size`` keys;
keys of the offer being counted are protected, so one large offer cannot evict its own
counts.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import Any

from offload_core.base import (
    LoadStoreSpec,
    OffloadingEvent,
    OffloadingManager,
    OffloadKey,
    PrepareStoreOutput,
    ReqContext,
)

DEFAULT_MAX_TRACKER_SIZE = 64_000  # vLLM 0.33's default


class FilteredOffloadingManager(OffloadingManager):
    """Wraps ``inner``; a new key is stored only from its ``store_threshold``-th offer."""

    def __init__(
        self,
        inner: OffloadingManager,
        store_threshold: int = 2,
        max_tracker_size: int = DEFAULT_MAX_TRACKER_SIZE,
    ) -> None:
        if store_threshold < 2:
            raise ValueError("store_threshold must be >= 2 (below 2 vLLM does not filter)")
        if max_tracker_size < 1:
            raise ValueError("max_tracker_size must be >= 1")
        self.inner = inner
        self.store_threshold = store_threshold
        self.max_tracker_size = max_tracker_size
        self._counts: OrderedDict[OffloadKey, int] = OrderedDict()
        self.stores_skipped = 0  # offers refused by the threshold so far (a metric)

    def offer_count(self, key: OffloadKey) -> int:
        """How many offers of ``key`` are remembered."""
        return self._counts.get(key, 0)

    def __len__(self) -> int:
        return len(self._counts)

    def __getattr__(self, name: str) -> Any:
        if name == "inner":  # not set yet (during construction or unpickling)
            raise AttributeError(name)
        # Inspection helpers of the wrapped manager (is_ready, ready_keys, num_blocks...).
        return getattr(self.inner, name)

    def _record_offer(self, keys: Sequence[OffloadKey]) -> None:
        counts = self._counts
        offered = set(keys)
        for key in offered:
            if key in counts:
                counts[key] += 1
                counts.move_to_end(key)
        unprotected = len(counts) - sum(1 for key in offered if key in counts)
        for key in dict.fromkeys(keys):
            if key in counts:
                continue
            if len(counts) >= self.max_tracker_size:
                if unprotected == 0:
                    continue  # every tracked key belongs to this offer: not counted
                counts.popitem(last=False)
                unprotected -= 1
            counts[key] = 1

    def lookup(self, key: OffloadKey, ctx: ReqContext) -> bool | None:
        return self.inner.lookup(key, ctx)

    def prepare_load(self, keys: Sequence[OffloadKey], ctx: ReqContext) -> LoadStoreSpec:
        return self.inner.prepare_load(keys, ctx)

    def touch(self, keys: Sequence[OffloadKey], ctx: ReqContext) -> None:
        self.inner.touch(keys, ctx)

    def complete_load(self, keys: Sequence[OffloadKey], ctx: ReqContext) -> None:
        self.inner.complete_load(keys, ctx)

    def prepare_store(
        self, keys: Sequence[OffloadKey], ctx: ReqContext
    ) -> PrepareStoreOutput | None:
        self._record_offer(keys)
        resident = self._resident
        threshold = self.store_threshold
        wanted = [k for k in keys if resident(k) or self._counts.get(k, 0) >= threshold]
        self.stores_skipped += len(keys) - len(wanted)
        return self.inner.prepare_store(wanted, ctx)

    def _resident(self, key: OffloadKey) -> bool:
        """On the tier already (ready or being stored): never filtered, as in vLLM."""
        contains = getattr(self.inner, "contains", None)
        if contains is not None:
            return bool(contains(key))
        return self.inner.lookup(key, ReqContext()) is True

    def complete_store(
        self, keys: Sequence[OffloadKey], ctx: ReqContext, success: bool = True
    ) -> None:
        self.inner.complete_store(keys, ctx, success)

    def take_events(self) -> Iterable[OffloadingEvent]:
        return self.inner.take_events()
