"""Shared fixtures (router and conformance tests): a real ``redis-server`` on a free port,
and ``tests/support`` (the test helpers: ``_helpers``, ``_kv_streams``) on ``sys.path``.

``redis_server`` (session) is one server for the whole run (``valkey_server`` one
valkey-server, skipped where it is not installed); ``redis_url`` hands each test
an empty database on it; ``redis_factory`` starts private servers a test may stop (outage
tests). A missing ``redis-server`` binary fails loudly instead of skipping.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "support"))
from _redis import RedisServer, start_redis_server


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    server = start_redis_server()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def valkey_server() -> Iterator[RedisServer]:
    """A ``valkey-server`` (the Redis fork); the tests using it skip where it is absent."""
    if shutil.which("valkey-server") is None:
        pytest.skip(
            "valkey-server not installed: `make system-deps` installs it from Debian "
            "bookworm-backports where it can (the Redis tests cover the same code)"
        )
    server = start_redis_server("valkey-server")
    yield server
    server.stop()


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    """An empty database on the shared server."""
    redis_server.client().flushall()
    return redis_server.url


@pytest.fixture
def redis_factory() -> Iterator[Callable[[], RedisServer]]:
    """Start private servers (e.g. to stop one mid-test); all are killed at the end."""
    started: list[RedisServer] = []

    def make() -> RedisServer:
        server = start_redis_server()
        started.append(server)
        return server

    yield make
    for server in started:
        server.stop()
