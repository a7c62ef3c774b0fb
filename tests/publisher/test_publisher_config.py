"""Endpoint rules (vLLM's), the config struct, the factory and the null publisher."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from _zmq_client import inproc_name, wait_until

from publisher import (
    KVEventsConfig,
    NullEventPublisher,
    ZmqEventPublisher,
    make_publisher,
    offset_endpoint_port,
    should_bind,
)
from schemas import AllBlocksCleared, KVEventBatch


@pytest.mark.parametrize(
    ("endpoint", "binds"),
    [
        ("tcp://*:5557", True),
        ("tcp://127.0.0.1:*", True),
        ("tcp://[::]:5557", True),
        ("tcp://[::1]:5557", True),
        ("ipc:///tmp/kv.sock", True),
        ("inproc://kv", True),
        ("tcp://127.0.0.1:5557", False),
        ("tcp://router.internal:5557", False),
    ],
)
def test_bind_or_connect_rule(endpoint: str, binds: bool) -> None:
    assert should_bind(endpoint) is binds


@pytest.mark.parametrize(
    ("endpoint", "rank", "want"),
    [
        ("tcp://*:5557", 0, "tcp://*:5557"),
        ("tcp://*:5557", 3, "tcp://*:5560"),
        ("tcp://10.0.0.1:5557", 1, "tcp://10.0.0.1:5558"),
        ("tcp://[::1]:5557", 2, "tcp://[::1]:5559"),
        ("tcp://127.0.0.1:*", 2, "tcp://127.0.0.1:*"),
        ("inproc://cache", 0, "inproc://cache"),
        ("inproc://cache", 2, "inproc://cache_dp2"),
        ("ipc:///tmp/kv", 1, "ipc:///tmp/kv_dp1"),
        (None, 4, None),
        ("", 4, ""),
    ],
)
def test_dp_offset(endpoint: str | None, rank: int, want: str | None) -> None:
    assert offset_endpoint_port(endpoint, rank) == want


@pytest.mark.parametrize("endpoint", ["tcp://host", "tcp://host:port", "udp://x:1"])
def test_dp_offset_rejects_what_it_cannot_offset(endpoint: str) -> None:
    with pytest.raises(ValueError):
        offset_endpoint_port(endpoint, 1)


def test_config_defaults_are_vllms() -> None:
    cfg = KVEventsConfig()
    assert cfg.enable_kv_cache_events is False and cfg.publisher is None
    assert cfg.endpoint == "tcp://*:5557" and cfg.replay_endpoint is None
    assert (cfg.buffer_steps, cfg.hwm, cfg.max_queue_size, cfg.topic) == (
        10_000,
        100_000,
        100_000,
        "",
    )


@pytest.mark.parametrize(
    "bad",
    [
        {"endpoint": 5557},
        {"buffer_steps": 0},
        {"max_queue_size": -1},
        {"hwm": -1},
        {"no_such_key": 1},
    ],
)
def test_config_validation(bad: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        KVEventsConfig.from_mapping(bad)
    with pytest.raises(ValueError):
        make_publisher({"enable_kv_cache_events": True, **bad})


@pytest.mark.parametrize(
    "cfg",
    [
        None,
        KVEventsConfig(),
        {"enable_kv_cache_events": False, "publisher": "zmq"},
        {"enable_kv_cache_events": True, "publisher": "null"},
    ],
)
def test_factory_disabled_gives_the_null_publisher(cfg: object) -> None:
    pub = make_publisher(cfg, data_parallel_rank=2)  # type: ignore[arg-type]
    assert isinstance(pub, NullEventPublisher)
    assert pub.data_parallel_rank == 2


def test_factory_unknown_kind() -> None:
    with pytest.raises(ValueError, match="unknown event publisher"):
        make_publisher({"enable_kv_cache_events": True, "publisher": "kafka"})


@pytest.fixture
def enabled() -> Iterator[list[ZmqEventPublisher]]:
    made: list[ZmqEventPublisher] = []
    yield made
    for pub in made:
        pub.shutdown(timeout=0.5)


def test_factory_builds_a_configured_zmq_publisher(enabled: list[ZmqEventPublisher]) -> None:
    name, rname = inproc_name(), inproc_name()
    pub = make_publisher(
        {
            "enable_kv_cache_events": True,
            "endpoint": name,
            "replay_endpoint": rname,
            "buffer_steps": 7,
            "hwm": 50,
            "max_queue_size": 3,
            "topic": "kv@w9",
        },
        data_parallel_rank=1,
    )
    assert isinstance(pub, ZmqEventPublisher)
    enabled.append(pub)
    assert (pub.endpoint, pub.replay_endpoint) == (f"{name}_dp1", f"{rname}_dp1")
    assert (pub.topic, pub.hwm, pub.data_parallel_rank) == ("kv@w9", 50, 1)
    b = KVEventBatch(ts=1.0, events=[AllBlocksCleared()])
    pub.publish(b)
    assert b.data_parallel_rank == 1
    wait_until(lambda: pub.published == 1)


def test_null_publisher_does_nothing() -> None:
    pub = NullEventPublisher()
    b = KVEventBatch(ts=1.0, events=[AllBlocksCleared()])
    pub.publish(b)
    pub.shutdown()
    pub.publish(b)
    assert b.data_parallel_rank is None
    assert pub.counters() == {"published": 0, "dropped": 0}


@pytest.mark.parametrize("endpoint", ["tcp://*:0", "tcp://127.0.0.1:0", "tcp://[::1]:0"])
def test_dp_offset_leaves_port_zero_to_the_os(endpoint: str) -> None:
    """vLLM: "a tcp port of 0 is left for the OS"; adding the rank made it port 1, 2..."""
    assert offset_endpoint_port(endpoint, 3) == endpoint
