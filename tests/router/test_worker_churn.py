"""Workers that come and go under fresh ids (autoscaled pods named per instance) leave
nothing behind in the router's per-worker tables, on the memory index and on Redis.

Found after the registration rollback: removing a worker created an empty pending-partials
table for it in the ingestor, and the Redis index kept its mapping epoch, one entry per
worker ever removed.
"""

from __future__ import annotations

from typing import Any

import pytest

from router.config import RouterSettings, WorkerSpec
from router.service import RouterService

CHURN = 30


def _tables_naming(obj: Any, prefix: str) -> dict[str, list[str]]:
    """Every dict (or set) attribute of ``obj`` with a key that names a churned worker."""
    found: dict[str, list[str]] = {}
    for name in dir(obj):
        if name.startswith("__"):
            continue
        try:
            value = getattr(obj, name)
        except Exception:  # a property that needs the index
            continue
        if isinstance(value, dict | set):
            keys = [k for k in value if isinstance(k, str) and k.startswith(prefix)]
            keys += [k[0] for k in value if isinstance(k, tuple) and str(k[0]).startswith(prefix)]
            if keys:
                found[name] = keys
    return found


@pytest.mark.parametrize("index", ["memory", "redis"])
async def test_registered_and_removed_workers_leave_no_entries(
    index: str, request: pytest.FixtureRequest
) -> None:
    extra: dict[str, Any] = {}
    if index == "redis":
        extra = {"index": "redis", "redis_url": request.getfixturevalue("redis_url")}
    svc = RouterService(RouterSettings(replay_timeout_s=1.0, **extra))
    await svc.start()
    try:
        for i in range(CHURN):
            spec = WorkerSpec(worker_id=f"churn-{i}", endpoint="tcp://127.0.0.1:1")
            await svc.add_worker(spec)
            await svc.worker_info(spec.worker_id)  # loads its state, as a status call does
            await svc.remove_worker(spec.worker_id)
        leftovers = {
            "ingestor": _tables_naming(svc.ingestor, "churn-"),
            "index": _tables_naming(svc.index, "churn-"),
            "registry": _tables_naming(svc.registry, "churn-"),
            "subscriptions": _tables_naming(svc.subscriptions, "churn-"),
        }
        mappings = getattr(svc.index, "_mappings", None)
        if mappings is not None:
            leftovers["index mappings"] = _tables_naming(mappings, "churn-")
        assert not any(leftovers.values()), leftovers
        assert svc.worker_ids() == [] and await svc.index.known_workers() == []
    finally:
        await svc.stop()
