"""``kvroute engine`` binds loopback only unless told otherwise (issue 14, security)."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

from _helpers import stop_process

from offload_core.engine_cli import build_parser
from publisher import publisher_binds
from router.netutil import free_port

REPO = Path(__file__).resolve().parents[2]


def test_kvroute_engine_defaults_bind_loopback_only() -> None:
    """``kvroute engine`` with no flags: HTTP, PUB and replay all on 127.0.0.1."""
    args = build_parser().parse_args([])
    assert args.host == "127.0.0.1"
    assert args.publish.startswith("tcp://127.0.0.1:") and args.publish_mode == "bind"
    assert args.replay.startswith("tcp://127.0.0.1:")
    assert publisher_binds(args.publish, args.publish_mode)


def _listening(port: int) -> set[str]:
    """Local IPv4 addresses with a TCP socket listening on ``port`` (from /proc)."""
    out = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        addr, p = local.split(":")
        if state == "0A" and int(p, 16) == port:
            out.add(socket.inet_ntoa(bytes.fromhex(addr)[::-1]))
    return out


def test_kvroute_engine_process_listens_on_loopback_only(tmp_path: Path) -> None:
    """The process, not just the parser: a loopback ``--publish`` with the default mode
    is bound (vLLM's rule would have connected), on 127.0.0.1 and nowhere else."""
    http, pub, rep = free_port(), free_port(), free_port()
    cmd = [sys.executable, "-m", "router.cli", "engine", "--port", str(http)]
    cmd += ["--publish", f"tcp://127.0.0.1:{pub}", "--replay", f"tcp://127.0.0.1:{rep}"]
    cmd += ["--gpu-blocks", "8", "--cpu-blocks", "0", "--device", "cpu"]
    with (tmp_path / "engine.log").open("wb") as log:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + 60
        while _listening(http) != {"127.0.0.1"}:
            assert proc.poll() is None, (tmp_path / "engine.log").read_text()
            assert time.monotonic() < deadline, "engine did not come up"
            time.sleep(0.05)
        assert _listening(pub) == {"127.0.0.1"}
        assert _listening(rep) == {"127.0.0.1"}
    finally:
        stop_process(proc)
