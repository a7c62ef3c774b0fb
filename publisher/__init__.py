"""ZMQ KV event publisher, wire-compatible with vLLM's."""

from publisher.base import EventPublisher, NullEventPublisher
from publisher.config import KVEventsConfig, make_publisher
from publisher.endpoints import (
    PUBLISH_MODES,
    PublishMode,
    offset_endpoint_port,
    publisher_binds,
    should_bind,
)
from publisher.zmq_publisher import ZmqEventPublisher

__all__ = [
    "PUBLISH_MODES",
    "EventPublisher",
    "KVEventsConfig",
    "NullEventPublisher",
    "PublishMode",
    "ZmqEventPublisher",
    "make_publisher",
    "offset_endpoint_port",
    "publisher_binds",
    "should_bind",
]
