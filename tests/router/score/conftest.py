"""Every score test runs on both cores (compiled and pure Python, router/native)."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _both_cores(core: str) -> str:
    return core
