"""Publisher configuration named like vLLM's ``KVEventsConfig``, and the factory.

Keeping vLLM's key names means an engine's ``--kv-events-config`` JSON works unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

import msgspec

from publisher.base import EventPublisher, NullEventPublisher
from publisher.endpoints import PublishMode
from publisher.zmq_publisher import ZmqEventPublisher

_Positive = Annotated[int, msgspec.Meta(ge=1)]


class KVEventsConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Where and how KV cache events are published (defaults are vLLM's)."""

    enable_kv_cache_events: bool = False
    # "zmq" or "null"; None means "zmq" when events are enabled (as in vLLM).
    publisher: str | None = None
    endpoint: str = "tcp://*:5557"
    replay_endpoint: str | None = None
    buffer_steps: _Positive = 10_000
    hwm: Annotated[int, msgspec.Meta(ge=0)] = 100_000
    max_queue_size: _Positive = 100_000
    topic: str = ""
    # kvroute's extension (vLLM has no such key): whether the PUB socket binds or
    # connects; "auto" is vLLM's rule (a wildcard or local transport binds).
    publish_mode: PublishMode = "auto"

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> KVEventsConfig:
        """Validate a dict (e.g. parsed JSON); raise ``ValueError`` on bad keys or types."""
        try:
            return msgspec.convert(dict(data), cls)
        except msgspec.ValidationError as exc:
            raise ValueError(f"invalid KV events config: {exc}") from None


def make_publisher(
    config: KVEventsConfig | Mapping[str, Any] | None, data_parallel_rank: int = 0
) -> EventPublisher:
    """Build the publisher ``config`` asks for; disabled or absent -> ``NullEventPublisher``."""
    if config is None:
        return NullEventPublisher(data_parallel_rank)
    if not isinstance(config, KVEventsConfig):
        config = KVEventsConfig.from_mapping(config)
    kind = config.publisher or ("zmq" if config.enable_kv_cache_events else "null")
    if not config.enable_kv_cache_events or kind == "null":
        return NullEventPublisher(data_parallel_rank)
    if kind != "zmq":
        raise ValueError(f"unknown event publisher {kind!r} (expected 'zmq' or 'null')")
    return ZmqEventPublisher(
        endpoint=config.endpoint,
        replay_endpoint=config.replay_endpoint,
        topic=config.topic,
        data_parallel_rank=data_parallel_rank,
        buffer_steps=config.buffer_steps,
        hwm=config.hwm,
        max_queue_size=config.max_queue_size,
        mode=config.publish_mode,
    )
