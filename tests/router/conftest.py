"""Router tests: the shared helpers live in tests/support (put on sys.path by
tests/conftest.py), the redis fixtures in tests/conftest.py."""

from collections.abc import Iterator

import pytest

from router import native


@pytest.fixture(params=["native", "python"])
def core(request: pytest.FixtureRequest) -> Iterator[str]:
    """Runs a test on the compiled core (router/native) and on the pure-Python paths;
    both must answer alike. Directories opt in with an autouse fixture."""
    if request.param == "native" and not native.available():
        pytest.skip("the compiled core is not built here (router/native)")
    before = native.ACTIVE != "python"
    native.set_active(request.param == "native")
    yield request.param
    native.set_active(before)
