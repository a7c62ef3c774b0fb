"""Ingest tests: a ``FakeEngine`` (XPUB + replay ROUTER the test controls) per test."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from _helpers import FakeEngine
from _kv_streams import Harness, new_index

from router.index.base import EngineSettings


@pytest.fixture
async def engine() -> AsyncIterator[FakeEngine]:
    eng = FakeEngine()
    yield eng
    await eng.close()


@pytest.fixture(params=["memory", "redis"])
async def report_full(request: pytest.FixtureRequest) -> AsyncIterator[Harness]:
    """Worker "w" registered with ``report_full`` (re-announcements), on both backends."""
    url = request.getfixturevalue("redis_url") if request.param == "redis" else None
    h = Harness.build(new_index(request.param, url))
    await h.ingestor.configure("w", EngineSettings(report_full=True))
    yield h
    await h.index.close()
