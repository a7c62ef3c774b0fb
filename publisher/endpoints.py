"""Endpoint rules shared with vLLM's ``ZmqEventPublisher``.

An engine and its consumers must agree on who binds and which port a data-parallel rank
uses without talking to each other, so these rules copy vLLM 0.33's behaviour exactly
where it defines one, and extend it only where vLLM would fail.
"""

from __future__ import annotations

import ipaddress
import os
import socket
from typing import Literal

import zmq

PublishMode = Literal["auto", "bind", "connect"]
PUBLISH_MODES: tuple[PublishMode, ...] = ("auto", "bind", "connect")


def should_bind(endpoint: str) -> bool:
    """True if the PUB socket binds ``endpoint``; False if it connects.

    vLLM's heuristic ("bind stable, connect volatile"): a wildcard host or port (``*``),
    an IPv6 address (``::``), or a local transport (``ipc://``, ``inproc://``) means the
    engine owns the address and binds; anything else names a remote peer to connect to.
    The replay ROUTER is not subject to this rule: it always binds, as in vLLM.
    """
    return (
        "*" in endpoint
        or "::" in endpoint
        or endpoint.startswith("ipc://")
        or endpoint.startswith("inproc://")
    )


def publisher_binds(endpoint: str, mode: str = "auto") -> bool:
    """Whether the PUB socket binds: ``bind``/``connect`` say so explicitly, ``auto`` is
    vLLM's rule (``should_bind``).

    The explicit choice exists because vLLM's rule cannot express "bind loopback only":
    ``tcp://127.0.0.1:5557`` would connect, so an engine that wants to own its address had
    to bind every interface (``tcp://*:5557``).
    """
    if mode == "bind":
        return True
    if mode == "connect":
        return False
    if mode == "auto":
        return should_bind(endpoint)
    raise ValueError(f"unknown publish mode {mode!r}: expected one of {', '.join(PUBLISH_MODES)}")


def offset_endpoint_port(endpoint: str | None, data_parallel_rank: int) -> str | None:
    """The endpoint data-parallel rank ``data_parallel_rank`` uses.

    As in vLLM: rank 0 (or no endpoint) leaves it unchanged; ``tcp://host:port`` becomes
    ``tcp://host:(port + rank)``; ``inproc://name`` becomes ``inproc://name_dp{rank}``.
    Port 0 is left as is (the OS picks a fresh port for each rank), as in vLLM.
    Extensions where vLLM raises: ``ipc://path`` gets the same ``_dp{rank}`` suffix, and a
    wildcard port (``tcp://host:*``) is left as is for the same reason as port 0.
    """
    if not endpoint or data_parallel_rank == 0:
        return endpoint
    if endpoint.startswith(("inproc://", "ipc://")):
        return f"{endpoint}_dp{data_parallel_rank}"
    if endpoint.startswith("tcp://"):
        base, sep, port = endpoint.rpartition(":")
        if not sep or base == "tcp":
            raise ValueError(f"tcp endpoint without a port: {endpoint!r}")
        if port == "*":
            return endpoint
        if not port.isdigit():
            raise ValueError(f"tcp endpoint with a bad port: {endpoint!r}")
        if int(port) == 0:
            return endpoint
        return f"{base}:{int(port) + data_parallel_rank}"
    raise ValueError(f"unsupported endpoint {endpoint!r}: expected tcp://, ipc:// or inproc://")


# vLLM binds this one endpoint to the node's IP (not every interface) on an OS-chosen port.
NODE_IP_ENDPOINT = "tcp://*:0"


def node_ip() -> str:
    """vLLM's ``get_ip()``: ``$VLLM_HOST_IP``, else the source address of the default route
    (IPv4, then IPv6; a UDP ``connect`` sends nothing), else ``0.0.0.0``."""
    host = os.environ.get("VLLM_HOST_IP", "")
    if host:
        return host
    probes = ((socket.AF_INET, "8.8.8.8"), (socket.AF_INET6, "2001:4860:4860::8888"))
    for family, address in probes:
        try:
            with socket.socket(family, socket.SOCK_DGRAM) as probe:
                probe.connect((address, 80))
                return str(probe.getsockname()[0])
        except OSError:
            continue
    return "0.0.0.0"


def bind(sock: zmq.Socket, endpoint: str) -> str:
    """Bind ``sock`` as vLLM does and return the concrete endpoint it bound.

    ``tcp://*:0`` binds the node's IP (``node_ip``) on an OS-chosen port, not every
    interface; without a node IP it raises ``ValueError`` (set ``VLLM_HOST_IP``).
    """
    if endpoint != NODE_IP_ENDPOINT:
        sock.bind(endpoint)
        return str(sock.getsockopt_string(zmq.LAST_ENDPOINT))
    ip = node_ip()
    if ip in ("0.0.0.0", "::"):
        raise ValueError(f"{NODE_IP_ENDPOINT} needs a node IP; set VLLM_HOST_IP")
    if ipaddress.ip_address(ip).version == 6:
        sock.setsockopt(zmq.IPV6, 1)
        sock.bind(f"tcp://[{ip}]:0")
    else:
        sock.bind(f"tcp://{ip}:0")
    return str(sock.getsockopt_string(zmq.LAST_ENDPOINT))
