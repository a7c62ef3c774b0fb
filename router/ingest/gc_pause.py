"""The cyclic garbage collector held off while a subscriber drains a backlog.

Why: a drain turn decodes thousands of token lists, stages them, writes them to the
index and drops them again; all of it is acyclic and freed by reference counting at the
flush. With the collector on, those live lists trip generation-0 collections every 700
container allocations, survivors are promoted and traversed again in generations 1 and
2: about a third of the router's ingest CPU (docs/benchmarks.md, "Router end to end").
Paused for one bounded turn (``_DRAIN_PER_TURN`` frames and their flush), the garbage is
gone before the collector would have looked at it; whatever a turn leaves behind is still
counted and collected at the next allocation after it. A turn that awaits (a Redis write,
a replay) leaves other tasks without cyclic collection for that long; reference counting
still frees their other garbage at once. A collector the application turned off stays off;
turns of several workers that interleave re-enable it when the first one ends.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def gc_paused() -> Iterator[None]:
    """Disable the cyclic collector for the ``with`` body (re-entrant, exception-safe)."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
