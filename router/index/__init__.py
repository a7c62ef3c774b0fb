"""Index backends behind one interface: ``memory`` (default, in process) and ``redis``."""

from __future__ import annotations

from typing import Any

from router.index.base import IndexBackend, IndexUnavailable

__all__ = ["IndexBackend", "IndexUnavailable", "make_index"]

INDEX_KINDS = ("memory", "redis")


def make_index(kind: str, redis_url: str | None = None, **opts: Any) -> IndexBackend:
    """Build a backend by name; ``redis`` needs ``redis_url`` (e.g. ``redis://host:6379/0``,
    or ``redis+cluster://host:port`` for a Redis Cluster, see docs/benchmarks.md)."""
    if kind == "memory":
        from router.index.memory import MemoryIndex

        return MemoryIndex(**opts)
    if kind == "redis":
        if not redis_url:
            raise ValueError("the redis index needs a redis_url")
        from router.index.redis import RedisIndex

        return RedisIndex(redis_url, **opts)
    raise ValueError(f"unknown index kind {kind!r}; expected one of {INDEX_KINDS}")
