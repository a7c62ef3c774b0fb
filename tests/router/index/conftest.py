"""The contract suite runs every test against each backend: a backend is done when green."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import pytest
from _kv_streams import Harness, new_index

BACKENDS = ["memory", "redis"]


@pytest.fixture(params=BACKENDS)
def backend_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def make_harness(
    backend_kind: str, request: pytest.FixtureRequest
) -> AsyncIterator[Callable[..., Harness]]:
    """Build harnesses on one store (redis: an empty database on the shared server)."""
    url = request.getfixturevalue("redis_url") if backend_kind == "redis" else None
    made: list[Harness] = []

    def make(**opts: object) -> Harness:
        h = Harness.build(new_index(backend_kind, url), **opts)
        made.append(h)
        return h

    yield make
    for h in made:
        await h.index.close()


@pytest.fixture
def harness(make_harness: Callable[..., Harness]) -> Harness:
    return make_harness()


@pytest.fixture(autouse=True)
def _both_cores(core: str) -> str:
    """Every index test runs on both cores (compiled and pure Python, router/native)."""
    return core
