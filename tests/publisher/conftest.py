"""Publisher test fixtures: one ZMQ context, and publishers/sockets closed after each test."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import zmq

from publisher import ZmqEventPublisher


@pytest.fixture
def ctx() -> zmq.Context:
    # The publisher's default context: inproc endpoints only work within one context.
    return zmq.Context.instance()


@pytest.fixture
def make_pub() -> Iterator[Callable[..., ZmqEventPublisher]]:
    made: list[ZmqEventPublisher] = []

    def make(*args: Any, **kwargs: Any) -> ZmqEventPublisher:
        pub = ZmqEventPublisher(*args, **kwargs)
        made.append(pub)
        return pub

    yield make
    for pub in made:
        pub.shutdown(timeout=0.5)


@pytest.fixture
def closing(ctx: zmq.Context) -> Iterator[Callable[[zmq.Socket], zmq.Socket]]:
    """Register a test's own socket to be closed at teardown."""
    socks: list[zmq.Socket] = []

    def track(sock: zmq.Socket) -> zmq.Socket:
        socks.append(sock)
        return sock

    yield track
    for sock in socks:
        sock.close(linger=0)
