"""Engine cache resets reported to the rest of the router.

An ``AllBlocksCleared`` means the engine reset its prefix cache (vLLM's
``/reset_prefix_cache``): the index drops the worker's entries, and ``Ingestor.on_clear``
listeners hear of it once the index took it -- the routing core then forgets the
worker's share of recent requests (``RoutingCore.caches_cleared``). Only the event:
``Ingestor.clear_worker`` (a resync after lost events, a failed write) and a new hash
unit void the router's keys, not the engine's cache, so nothing is reported for them.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Sequence

log = logging.getLogger(__name__)

# An AllBlocksCleared's published batch: (DP rank, seq, payload crc32); None unmarked.
ClearMark = tuple[int, int, int] | None

# Per worker, how many reported clears are remembered.
REMEMBERED = 8


class ClearLog:
    """Reports each engine clear once per published batch: a resync rebuilds a worker
    from the publisher's buffer, which may still hold a clear reported before (an old
    reset, not a new one). Unmarked clears (``apply_batch`` without marks) always count."""

    def __init__(self) -> None:
        self._reported: dict[str, deque[tuple[int, int, int]]] = {}

    def report(
        self, listeners: Sequence[Callable[[str], None]], cleared: Sequence[tuple[str, ClearMark]]
    ) -> None:
        for worker_id, mark in cleared:
            if mark is not None:
                seen = self._reported.setdefault(worker_id, deque(maxlen=REMEMBERED))
                if mark in seen:
                    continue
                seen.append(mark)
            for listener in listeners:
                try:
                    listener(worker_id)
                except Exception:  # a listener's bug must not fail the index write
                    log.exception("on_clear listener failed for worker %s", worker_id)

    def forget(self, worker_id: str) -> None:
        self._reported.pop(worker_id, None)
