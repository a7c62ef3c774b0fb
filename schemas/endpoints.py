"""Endpoint validation for worker registration: what the router may be told to connect to.

Why at the boundary: ZMQ accepts many strings at ``connect`` (``tcp://127.0.0.1:0``,
``tcp://256.0.0.1:5``, ``inproc://x``) that can never reach an engine, so a worker
registered with one showed ``connecting`` forever. Here an endpoint must be
``tcp://HOST:PORT`` (a hostname, an IPv4 address or a bracketed IPv6 address; port
1-65535) or ``ipc://PATH``, and an HTTP endpoint ``http(s)://HOST[:PORT][/path]``.

The allow-list (``worker_allow``) names hosts, ``*.suffix`` patterns and CIDRs. A
hostname endpoint matches only host entries: names are never resolved here, so DNS
cannot be used to step around a CIDR rule.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from urllib.parse import urlsplit

__all__ = [
    "MAX_ENDPOINT_LEN",
    "AllowList",
    "endpoint_host",
    "parse_allow_list",
    "validate_http_endpoint",
    "validate_zmq_endpoint",
]

MAX_ENDPOINT_LEN = 512
_LABEL = r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)"
_HOSTNAME = re.compile(rf"^{_LABEL}(\.{_LABEL})*\.?$")
_IPV4ISH = re.compile(r"^[0-9.]+$")

IpNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


def _check_host(host: str, endpoint: str) -> str:
    """Normalised host (IPv6 without brackets); ``ValueError`` for anything unusable."""
    if not host:
        raise ValueError(f"endpoint {endpoint!r} has no host")
    if host == "*":
        raise ValueError(
            f"endpoint {endpoint!r} is a bind wildcard; name a host the router can reach, "
            "e.g. tcp://10.0.0.5:5557"
        )
    if host.startswith("["):
        if not host.endswith("]"):
            raise ValueError(f"endpoint {endpoint!r}: unbalanced '[' in the IPv6 address")
        try:
            addr = ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            raise ValueError(f"endpoint {endpoint!r}: invalid IPv6 address") from None
        if addr.is_unspecified:
            raise ValueError(f"endpoint {endpoint!r}: '::' is not a host to connect to")
        return str(addr)
    if _IPV4ISH.match(host):
        try:
            v4 = ipaddress.IPv4Address(host)
        except ValueError:
            raise ValueError(f"endpoint {endpoint!r}: invalid IPv4 address {host!r}") from None
        if v4.is_unspecified:
            raise ValueError(f"endpoint {endpoint!r}: 0.0.0.0 is not a host to connect to")
        return str(v4)
    if not _HOSTNAME.match(host) or len(host) > 253:
        raise ValueError(f"endpoint {endpoint!r}: invalid host name {host!r}")
    return host.lower().rstrip(".")


def _check_port(port: str | int | None, endpoint: str) -> int:
    text = str(port) if port is not None else ""
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise ValueError(f"endpoint {endpoint!r}: port must be 1-65535, got {text or 'none'!r}")
    return int(text)


def validate_zmq_endpoint(endpoint: str) -> str:
    """``endpoint`` unchanged if a router can connect to it; ``ValueError`` naming why."""
    if len(endpoint) > MAX_ENDPOINT_LEN:
        raise ValueError(f"endpoint longer than {MAX_ENDPOINT_LEN} characters")
    scheme, sep, rest = endpoint.partition("://")
    if not sep:
        raise ValueError(f"endpoint {endpoint!r}: expected tcp://HOST:PORT or ipc://PATH")
    if scheme == "ipc":
        if not rest or "\x00" in rest:
            raise ValueError(f"endpoint {endpoint!r}: empty or invalid ipc path")
        return endpoint
    if scheme != "tcp":
        raise ValueError(
            f"endpoint {endpoint!r}: scheme {scheme!r} cannot reach an engine; "
            "expected tcp://HOST:PORT or ipc://PATH"
        )
    if ";" in rest:  # ZMQ's "source;destination" form: not for registrations
        raise ValueError(f"endpoint {endpoint!r}: a source address is not accepted")
    host, sep, port = rest.rpartition(":")
    if not sep:
        raise ValueError(f"endpoint {endpoint!r}: expected tcp://HOST:PORT")
    _check_host(host, endpoint)
    _check_port(port, endpoint)
    return endpoint


def validate_http_endpoint(url: str) -> str:
    """An ``http(s)://HOST[:PORT][/path]`` base URL, else ``ValueError``."""
    if len(url) > MAX_ENDPOINT_LEN:
        raise ValueError(f"http endpoint longer than {MAX_ENDPOINT_LEN} characters")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise ValueError(f"http endpoint {url!r}: expected http://HOST[:PORT]")
    if parts.username is not None or parts.password is not None:
        raise ValueError(f"http endpoint {url!r}: credentials in the URL are not accepted")
    host = parts.netloc.rpartition("@")[2]
    if host.startswith("["):
        host = host[: host.index("]") + 1] if "]" in host else host
    else:
        host = host.partition(":")[0]
    _check_host(host, url)
    try:
        port = parts.port
    except ValueError:
        raise ValueError(f"http endpoint {url!r}: invalid port") from None
    if port is not None:
        _check_port(port, url)
    return url


def endpoint_host(endpoint: str) -> str | None:
    """The normalised host of a tcp:// or http(s):// endpoint; None for ipc://."""
    if endpoint.startswith("ipc://"):
        return None
    if endpoint.startswith("tcp://"):
        host = endpoint[len("tcp://") :].rpartition(":")[0]
    else:
        netloc = urlsplit(endpoint).netloc.rpartition("@")[2]
        host = netloc[: netloc.index("]") + 1] if netloc.startswith("[") else netloc
        host = host if host.startswith("[") else host.partition(":")[0]
    return _check_host(host, endpoint)


@dataclass(frozen=True)
class AllowList:
    """Hosts, ``*.suffix`` patterns and networks a worker endpoint may name."""

    networks: tuple[IpNetwork, ...] = ()
    hosts: frozenset[str] = frozenset()
    suffixes: tuple[str, ...] = ()
    allow_ipc: bool = False

    def __bool__(self) -> bool:
        return bool(self.networks or self.hosts or self.suffixes or self.allow_ipc)

    def allows(self, endpoint: str) -> bool:
        host = endpoint_host(endpoint)
        if host is None:
            return self.allow_ipc
        try:
            addr = ipaddress.ip_address(host)
        except ValueError:
            return host in self.hosts or any(host.endswith(s) for s in self.suffixes)
        return any(addr in net for net in self.networks) or host in self.hosts


def parse_allow_list(entries: list[str]) -> AllowList:
    """``["10.0.0.0/8", "127.0.0.1", "engine-3", "*.gpu.internal", "ipc"]`` -> AllowList;
    ``ValueError`` naming the first entry that is none of these."""
    networks: list[IpNetwork] = []
    hosts: set[str] = set()
    suffixes: list[str] = []
    allow_ipc = False
    for raw in entries:
        entry = raw.strip()
        if entry == "ipc":
            allow_ipc = True
            continue
        try:
            networks.append(ipaddress.ip_network(entry.strip("[]"), strict=False))
            continue
        except ValueError:
            pass
        if entry.startswith("*.") and _HOSTNAME.match(entry[2:]):
            suffixes.append("." + entry[2:].lower().rstrip("."))
        elif _HOSTNAME.match(entry) and not _IPV4ISH.match(entry):
            hosts.add(entry.lower().rstrip("."))
        else:
            raise ValueError(f"worker_allow entry {raw!r} is not a host, *.suffix, CIDR or 'ipc'")
    return AllowList(tuple(networks), frozenset(hosts), tuple(suffixes), allow_ipc)
