"""``kvroute bench``: trace-driven routing benchmarks in simulated time (no sockets).

``kvroute bench routing`` compares policies against the shared-cache and infinite-cache
bounds; ``kvroute bench hma`` compares HMA-exact scoring with its common shortcuts on a
hybrid (full + sliding window) model.
"""

from __future__ import annotations

from collections.abc import Sequence


def main(argv: Sequence[str]) -> int:
    from router.bench.commands import main as run

    return run(argv)
