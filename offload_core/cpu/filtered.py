"""Store only blocks that are asked for repeatedly.

Offloading a block costs a device-to-host copy and pushes an older block out of the CPU
tier; a block looked up once (a one-shot prompt) is rarely worth it. This wrapper counts
``lookup`` calls per key and lets ``prepare_store`` through only for keys looked up at
least ``min_lookups`` times; every other call goes to the wrapped manager unchanged.

The counter is bounded: it remembers the ``max_tracked`` most recently looked-up keys and
forgets the oldest, so memory stays flat under an endless stream of new prompts.

Note that a prefix lookup stops at the first miss, so with ``min_lookups=2`` a repeated
prompt becomes eligible one missing block per repetition; a caller that knows the whole
request can count its remaining blocks with ``note_lookups`` (no lookup is forwarded).
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


class FilteredOffloadingManager(OffloadingManager):
    """Wraps ``inner``; stores a key only after ``min_lookups`` lookups of it."""

    def __init__(
        self, inner: OffloadingManager, min_lookups: int = 2, max_tracked: int = 100_000
    ) -> None:
        if min_lookups < 1:
            raise ValueError("min_lookups must be >= 1")
        if max_tracked < 1:
            raise ValueError("max_tracked must be >= 1")
        self.inner = inner
        self.min_lookups = min_lookups
        self.max_tracked = max_tracked
        self._counts: OrderedDict[OffloadKey, int] = OrderedDict()
        self.filtered_keys = 0  # keys refused by prepare_store so far (a metric)

    def lookup_count(self, key: OffloadKey) -> int:
        """How many lookups of ``key`` are remembered."""
        return self._counts.get(key, 0)

    def __len__(self) -> int:
        return len(self._counts)

    def __getattr__(self, name: str) -> Any:
        if name == "inner":  # not set yet (during construction or unpickling)
            raise AttributeError(name)
        # Inspection helpers of the wrapped manager (is_ready, ready_keys, ...).
        return getattr(self.inner, name)

    def _count(self, key: OffloadKey) -> None:
        counts = self._counts
        counts[key] = counts.get(key, 0) + 1
        counts.move_to_end(key)
        if len(counts) > self.max_tracked:
            counts.popitem(last=False)

    def note_lookups(self, keys: Sequence[OffloadKey]) -> None:
        """Count ``keys`` as looked up without asking the wrapped manager."""
        for key in keys:
            self._count(key)

    def lookup(self, key: OffloadKey, ctx: ReqContext) -> bool | None:
        self._count(key)
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
        threshold = self.min_lookups
        wanted = [key for key in keys if self._counts.get(key, 0) >= threshold]
        self.filtered_keys += len(keys) - len(wanted)
        return self.inner.prepare_store(wanted, ctx)

    def complete_store(
        self, keys: Sequence[OffloadKey], ctx: ReqContext, success: bool = True
    ) -> None:
        self.inner.complete_store(keys, ctx, success)

    def take_events(self) -> Iterable[OffloadingEvent]:
        return self.inner.take_events()
