"""A worker subscription's sockets, and what to tell the operator when none speaks.

Separate from the apply loop (``router.ingest.subscription``): opening is all-or-nothing
(a failure leaks no socket, so repeated bad registrations cannot exhaust the context),
and the hint is about deployment, not sequencing.
"""

from __future__ import annotations

import zmq
import zmq.asyncio

from router.config import RouterSettings, WorkerSpec
from router.netutil import (
    InvalidEndpoint,
    bind_endpoint,
    close_monitored,
    connect_endpoint,
    open_monitor,
)


def open_worker_sockets(
    spec: WorkerSpec, ctx: zmq.asyncio.Context, settings: RouterSettings
) -> tuple[zmq.asyncio.Socket, zmq.asyncio.Socket]:
    """The SUB (connected, or bound with ``bind``) and its monitor;
    raises ``InvalidEndpoint`` (or ``ZMQError`` when the context is out of sockets)
    without leaking what it opened."""
    sub: zmq.asyncio.Socket | None = None
    monitor: zmq.asyncio.Socket | None = None
    try:
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.RCVHWM, settings.sub_hwm)
        sub.setsockopt(zmq.RECONNECT_IVL, 100)
        sub.setsockopt(zmq.RECONNECT_IVL_MAX, 2000)
        sub.setsockopt(zmq.SUBSCRIBE, spec.topic.encode())
        monitor = open_monitor(ctx, sub)
        if spec.bind:
            # Only where we bind: the connecting peer reconnects after ZMQ drops it for an
            # oversized message, while a SUB that connects is never reconnected after one
            # (libzmq ends a session on a protocol error): one big batch would cut the
            # worker off for good. A connected worker is an engine the operator named.
            sub.setsockopt(zmq.MAXMSGSIZE, settings.sub_max_message_bytes)
            bind_endpoint(sub, spec.endpoint)
        else:
            connect_endpoint(sub, spec.endpoint)
        if spec.replay_endpoint is not None:
            probe = ctx.socket(zmq.DEALER)
            try:
                connect_endpoint(probe, spec.replay_endpoint)
            finally:
                probe.close(linger=0)
    except (InvalidEndpoint, zmq.ZMQError):
        close_monitored(sub, monitor)
        raise
    return sub, monitor


def silent_hint(spec: WorkerSpec) -> str:
    """The likely cause when a worker sent nothing since registration."""
    ep = spec.endpoint
    if spec.bind:
        return "is the engine's endpoint pointed at this router?"
    if ep.startswith("tcp://") and not ep.startswith(("tcp://*", "tcp://[::]")):
        return (
            "is the engine up? If it was given this tcp://host:port too, it connects "
            "(vLLM binds only for * / :: / ipc): register with bind=true"
        )
    return "is the engine up and publishing there?"
