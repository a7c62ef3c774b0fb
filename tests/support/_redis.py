"""A real ``redis-server`` (or ``valkey-server``) child process for tests: on a free port
(the session fixtures in ``tests/conftest.py``), or on a given one (tests that stop a
server and start it again where the router expects it)."""

from __future__ import annotations

import shutil
import subprocess
import time
from dataclasses import dataclass

import pytest
import redis

from router.netutil import free_port

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


def start_redis_server(name: str = "redis-server", port: int | None = None) -> RedisServer:
    """``name``: the server binary (``valkey-server`` speaks the same protocol); ``port``:
    where to listen (default a free one, tried three times: a free port can be taken
    between probe and bind)."""
    binary = shutil.which(name)
    if binary is None:
        pytest.fail(
            f"{name} not found on PATH: the router tests need a real Redis "
            "(`apt-get install -y redis-server`, or run `make test`, which installs it)",
            pytrace=False,
        )
    last_error = ""
    for _attempt in range(3 if port is None else 1):
        listen = free_port() if port is None else port
        proc = subprocess.Popen(
            [
                binary,
                "--port",
                str(listen),
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
        server = RedisServer(listen, proc)
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
