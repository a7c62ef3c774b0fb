"""A worker subscription's sockets, and what to tell the operator when none speaks.

Separate from the apply loop (``router.ingest.subscription``): opening is all-or-nothing
(a failure leaks no socket, so repeated bad registrations cannot exhaust the context),
and the hint is about deployment, not sequencing.
"""

from __future__ import annotations

import contextlib

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


def new_sub(ctx: zmq.asyncio.Context, settings: RouterSettings) -> zmq.asyncio.Socket:
    """A SUB with the options every one of ours has (a worker's, the ``listen`` one).

    ``sub_max_message_bytes``: an oversized message is a protocol error, on which ZMQ
    drops the connection. A peer that connects to us reconnects; where we connect,
    libzmq ends the session for good and ``reopen`` below (called by the subscription)
    connects again."""
    sub = ctx.socket(zmq.SUB)
    try:
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.RCVHWM, settings.sub_hwm)
        sub.setsockopt(zmq.MAXMSGSIZE, settings.sub_max_message_bytes)
    except zmq.ZMQError:
        sub.close(linger=0)
        raise
    return sub


def open_worker_sockets(
    spec: WorkerSpec, ctx: zmq.asyncio.Context, settings: RouterSettings
) -> tuple[zmq.asyncio.Socket, zmq.asyncio.Socket]:
    """The SUB (connected, or bound with ``bind``) and its monitor;
    raises ``InvalidEndpoint`` (or ``ZMQError`` when the context is out of sockets)
    without leaking what it opened."""
    sub: zmq.asyncio.Socket | None = None
    monitor: zmq.asyncio.Socket | None = None
    try:
        sub = new_sub(ctx, settings)
        sub.setsockopt(zmq.RECONNECT_IVL, 100)
        sub.setsockopt(zmq.RECONNECT_IVL_MAX, 2000)
        sub.setsockopt(zmq.SUBSCRIBE, spec.topic.encode())
        monitor = open_monitor(ctx, sub)
        if spec.bind:
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


# How long a connecting SUB may stay disconnected with no reconnect attempt under way
# before it is connected again. After an ordinary disconnect libzmq reports its first
# retry at once (EVENT_CONNECT_RETRIED, measured: 0 ms); after a protocol error -- an
# oversized message, a malformed frame -- it never retries.
REOPEN_AFTER_S = 2.0


def reopen(sub: zmq.asyncio.Socket, endpoint: str) -> bool:
    """Connect ``sub`` to ``endpoint`` again (a session libzmq ended for good); False when
    the endpoint cannot be connected now (retried on the next disconnect timeout)."""
    with contextlib.suppress(zmq.ZMQError):  # the ended session may be gone already
        sub.disconnect(endpoint)
    try:
        connect_endpoint(sub, endpoint)
    except InvalidEndpoint:
        return False
    return True


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
