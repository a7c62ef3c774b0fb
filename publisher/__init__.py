"""ZMQ KV event publisher, wire-compatible with vLLM's."""

from publisher.config import KVEventsConfig, make_publisher
from publisher.endpoints import offset_endpoint_port, should_bind
from publisher.zmq_publisher import (
    EventPublisher,
    NullEventPublisher,
    ZmqEventPublisher,
)

__all__ = [
    "EventPublisher",
    "KVEventsConfig",
    "NullEventPublisher",
    "ZmqEventPublisher",
    "make_publisher",
    "offset_endpoint_port",
    "should_bind",
]
