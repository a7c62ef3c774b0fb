"""Ingest tests: a ``FakeEngine`` (XPUB + replay ROUTER the test controls) per test."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from _helpers import FakeEngine
from _kv_streams import Harness, configured_harness


@pytest.fixture
async def engine() -> AsyncIterator[FakeEngine]:
    eng = FakeEngine()
    yield eng
    await eng.close()


@pytest.fixture(params=["memory", "redis"])
async def report_full(request: pytest.FixtureRequest) -> AsyncIterator[Harness]:
    """Worker "w" registered with ``report_full`` (re-announcements), on both backends."""
    h = await configured_harness(request, report_full=True)
    yield h
    await h.index.close()
