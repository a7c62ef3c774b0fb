"""Binding as vLLM 0.33 binds: port 0 per DP rank, and ``tcp://*:0`` on the node's IP."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import zmq
from _zmq_client import END_MARKER, replay, seq_of, subscribe, wait_until

from publisher import ZmqEventPublisher
from publisher.endpoints import node_ip
from schemas import AllBlocksCleared, KVEventBatch


def _port(endpoint: str | None) -> int:
    assert endpoint is not None
    return int(endpoint.rsplit(":", 1)[1])


def _serves(ctx: zmq.Context, pub: ZmqEventPublisher) -> None:
    """Live frames reach a SUB on ``bound_endpoint``; replay answers on the replay one."""
    assert pub.bound_endpoint is not None and pub.bound_replay_endpoint is not None
    sub = subscribe(ctx, pub.bound_endpoint)
    try:
        sent = 0

        def got_one() -> bool:  # slow joiner: publish until one arrives
            nonlocal sent
            pub.publish(KVEventBatch(ts=1.0, events=[AllBlocksCleared()]))
            sent += 1
            return bool(sub.poll(20))

        wait_until(got_one)
        assert seq_of(sub.recv_multipart()) < sent
    finally:
        sub.close(linger=0)
    wait_until(lambda: pub.published == sent)
    frames = replay(ctx, pub.bound_replay_endpoint, 0)
    assert frames[-1] == END_MARKER and len(frames) == sent + 1


def test_port_zero_is_not_offset_by_the_dp_rank(
    ctx: zmq.Context, make_pub: Callable[..., ZmqEventPublisher]
) -> None:
    """Rank 2 with port 0 binds two OS-chosen ports (it bound port 2 twice: EADDRINUSE,
    or EACCES without root)."""
    pub = make_pub(
        "tcp://127.0.0.1:0",
        replay_endpoint="tcp://127.0.0.1:0",
        data_parallel_rank=2,
        mode="bind",
    )
    assert (pub.endpoint, pub.replay_endpoint) == ("tcp://127.0.0.1:0",) * 2
    assert _port(pub.bound_endpoint) > 1024 and _port(pub.bound_replay_endpoint) > 1024
    _serves(ctx, pub)


@pytest.mark.parametrize("rank", [0, 1])
def test_wildcard_port_zero_binds_the_node_ip_like_vllm(
    ctx: zmq.Context,
    make_pub: Callable[..., ZmqEventPublisher],
    monkeypatch: pytest.MonkeyPatch,
    rank: int,
) -> None:
    """vLLM binds ``tcp://*:0`` to ``get_ip()`` ($VLLM_HOST_IP first) and reports that
    address; binding every interface (0.0.0.0) exposed the port beyond the node's IP."""
    monkeypatch.setenv("VLLM_HOST_IP", "127.0.0.1")
    assert node_ip() == "127.0.0.1"
    pub = make_pub("tcp://*:0", replay_endpoint="tcp://*:0", data_parallel_rank=rank)
    for bound in (pub.bound_endpoint, pub.bound_replay_endpoint):
        assert bound is not None and bound.startswith("tcp://127.0.0.1:"), bound
        assert _port(bound) > 1024
    _serves(ctx, pub)


def test_wildcard_port_zero_without_a_node_ip_is_refused(
    make_pub: Callable[..., ZmqEventPublisher], monkeypatch: pytest.MonkeyPatch
) -> None:
    """vLLM raises rather than bind every interface when it finds no node IP."""
    monkeypatch.setenv("VLLM_HOST_IP", "0.0.0.0")
    with pytest.raises(ValueError, match="VLLM_HOST_IP"):
        make_pub("tcp://*:0")
