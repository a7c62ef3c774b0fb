"""``kvroute engine`` binds loopback only unless told otherwise (issue 14, security)."""

from __future__ import annotations

from offload_core.engine_cli import build_parser
from publisher import publisher_binds


def test_kvroute_engine_defaults_bind_loopback_only() -> None:
    """``kvroute engine`` with no flags: HTTP, PUB and replay all on 127.0.0.1."""
    args = build_parser().parse_args([])
    assert args.host == "127.0.0.1"
    assert args.publish.startswith("tcp://127.0.0.1:") and args.publish_mode == "bind"
    assert args.replay.startswith("tcp://127.0.0.1:")
    assert publisher_binds(args.publish, args.publish_mode)
