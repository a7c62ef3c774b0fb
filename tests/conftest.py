"""Shared fixtures (router and conformance tests): a real ``redis-server`` on a free port,
and ``tests/support`` (the test helpers: ``_helpers``, ``_kv_streams``) on ``sys.path``.

``redis_server`` (session) is one server for the whole run (``valkey_server`` one
valkey-server, skipped where it is not installed); ``redis_url`` hands each test
an empty database on it; ``redis_factory`` starts private servers a test may stop (outage
tests). A missing ``redis-server`` binary fails loudly instead of skipping.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis

from router.netutil import free_port

sys.path.insert(0, str(Path(__file__).resolve().parent / "support"))

START_DEADLINE_S = 15.0


@dataclass
class RedisServer:
    """A redis-server child process; ``stop()`` is idempotent."""

    port: int
    proc: subprocess.Popen[bytes]

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=5)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)


def start_redis_server(name: str = "redis-server") -> RedisServer:
    """``name``: the server binary (``valkey-server`` speaks the same protocol)."""
    binary = shutil.which(name)
    if binary is None:
        pytest.fail(
            f"{name} not found on PATH: the router tests need a real Redis "
            "(`apt-get install -y redis-server`, or run `make test`, which installs it)",
            pytrace=False,
        )
    last_error = ""
    for _attempt in range(3):  # a free port can be taken between probe and bind
        port = free_port()
        proc = subprocess.Popen(
            [
                binary,
                "--port",
                str(port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        server = RedisServer(port, proc)
        deadline = time.monotonic() + START_DEADLINE_S
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                if server.client().ping():
                    return server
            except redis.exceptions.ConnectionError as exc:
                last_error = str(exc)
            time.sleep(0.02)
        server.stop()
        last_error = f"{last_error} (exit code {proc.returncode})"
    pytest.fail(f"{name} did not answer PING: {last_error}", pytrace=False)


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
