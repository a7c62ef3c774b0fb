"""Ingest tests: a ``FakeEngine`` (XPUB + replay ROUTER the test controls) per test."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from _helpers import FakeEngine


@pytest.fixture
async def engine() -> AsyncIterator[FakeEngine]:
    eng = FakeEngine()
    yield eng
    await eng.close()
