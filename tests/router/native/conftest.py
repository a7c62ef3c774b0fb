"""Native-core tests: a fixture that runs a case on the pure-Python paths."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from router import native


@pytest.fixture
def python_core() -> Iterator[None]:
    before = native.ACTIVE != "python"
    native.set_active(False)
    yield
    native.set_active(before)
