"""The PUB socket's explicit bind/connect choice.

vLLM's rule binds only wildcard/``::``/local endpoints, so an engine that owns its port
had to bind every interface (``tcp://*:5557``); ``mode="bind"`` binds a loopback address.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import zmq
from _zmq_client import wait_until

from publisher import (
    KVEventsConfig,
    ZmqEventPublisher,
    make_publisher,
    publisher_binds,
)
from router.netutil import free_port
from schemas import AllBlocksCleared, KVEventBatch


@pytest.mark.parametrize(
    ("endpoint", "mode", "binds"),
    [
        ("tcp://127.0.0.1:5557", "auto", False),  # vLLM: a concrete host connects
        ("tcp://*:5557", "auto", True),
        ("tcp://127.0.0.1:5557", "bind", True),
        ("tcp://*:5557", "connect", False),
        ("ipc:///tmp/x", "connect", False),
    ],
)
def test_publish_mode_overrides_vllms_rule(endpoint: str, mode: str, binds: bool) -> None:
    assert publisher_binds(endpoint, mode) is binds


def test_unknown_publish_mode_is_refused() -> None:
    with pytest.raises(ValueError, match="publish mode"):
        publisher_binds("tcp://*:1", "listen")
    with pytest.raises(ValueError, match="publish mode"):
        ZmqEventPublisher("tcp://127.0.0.1:1", mode="listen", start=False)
    with pytest.raises(ValueError):
        KVEventsConfig.from_mapping({"publish_mode": "listen"})


def _roundtrip(pub: ZmqEventPublisher, sub: zmq.Socket) -> None:
    sub.setsockopt(zmq.SUBSCRIBE, b"")

    def got_one() -> bool:  # PUB drops what it sends before the SUB joined: resend
        pub.publish(KVEventBatch(ts=1.0, events=[AllBlocksCleared()]))
        return bool(sub.poll(50))

    wait_until(got_one, timeout=10)
    topic, seq, _ = sub.recv_multipart()
    assert topic == b"kv" and len(seq) == 8


def test_bind_mode_binds_a_loopback_address(
    make_pub: Callable[..., ZmqEventPublisher], ctx: zmq.Context
) -> None:
    port = free_port()
    pub = make_pub(f"tcp://127.0.0.1:{port}", topic="kv", mode="bind")
    # Bound: the concrete address, not "connected to" it (vLLM's rule would connect).
    assert pub.bound_endpoint == f"tcp://127.0.0.1:{port}"
    sub = ctx.socket(zmq.SUB)
    try:
        sub.connect(f"tcp://127.0.0.1:{port}")
        _roundtrip(pub, sub)
    finally:
        sub.close(linger=0)


def test_connect_mode_connects_to_a_subscriber_that_binds(ctx: zmq.Context) -> None:
    sub = ctx.socket(zmq.SUB)
    try:
        sub.bind("tcp://127.0.0.1:*")
        endpoint = sub.getsockopt_string(zmq.LAST_ENDPOINT)
        pub = make_publisher(
            {
                "enable_kv_cache_events": True,
                "endpoint": endpoint,
                "topic": "kv",
                "publish_mode": "connect",
            }
        )
        assert isinstance(pub, ZmqEventPublisher)
        try:
            assert pub.mode == "connect" and pub.bound_endpoint == endpoint
            _roundtrip(pub, sub)
        finally:
            pub.shutdown(timeout=0.5)
    finally:
        sub.close(linger=0)
