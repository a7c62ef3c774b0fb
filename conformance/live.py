"""``make conformance``: vLLM 0.33's own manager and publisher against a real kvroute.

For each index backend (memory, then Redis on a private ``redis-server``), starts
``kvroute serve`` (from .venv) on loopback, runs ``conformance.vllm_driver --live`` (in
.venv-vllm) against it and prints one table: per scenario, the probes where kvroute's
``/v1/score`` equals what vLLM reuses, and the events kvroute rejected (from /metrics).
Stdlib only; exits non-zero when a probe or an event disagrees.
"""

from __future__ import annotations

import argparse
import json
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
START_S = 30.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_http(url: str, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + START_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args} exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=1):
                return
        except OSError:
            time.sleep(0.1)
    raise TimeoutError(f"{url} never answered")


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def run_backend(kind: str, venv: Path, vllm_venv: Path, scenarios: list[str]) -> list[dict]:
    procs: list[subprocess.Popen[bytes]] = []
    try:
        args = [str(venv / "bin" / "kvroute"), "serve", "--log-level", "warning"]
        if kind == "redis":
            binary = shutil.which("redis-server")
            if binary is None:
                raise RuntimeError("redis-server not found (make system-deps)")
            rport = free_port()
            cmd = [binary, "--port", str(rport), "--bind", "127.0.0.1", "--save", ""]
            procs.append(subprocess.Popen([*cmd, "--appendonly", "no"], stdout=subprocess.DEVNULL))
            args += ["--index", "redis", "--redis-url", f"redis://127.0.0.1:{rport}/0"]
        else:
            args += ["--index", "memory"]
        port = free_port()
        router = subprocess.Popen([*args, "--host", "127.0.0.1", "--port", str(port)])
        procs.append(router)
        url = f"http://127.0.0.1:{port}"
        wait_http(f"{url}/readyz", router)
        cmd = [str(vllm_venv / "bin" / "python"), "-m", "conformance.vllm_driver", "--live", url]
        for name in scenarios:
            cmd += ["--scenario", name]
        out = subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.PIPE, text=True)
        return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    finally:
        for proc in reversed(procs):
            stop(proc)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--venv", type=Path, default=ROOT / ".venv")
    ap.add_argument("--vllm-venv", type=Path, default=ROOT / ".venv-vllm")
    ap.add_argument("--index", action="append", choices=["memory", "redis"])
    ap.add_argument("--scenario", action="append", default=[])
    args = ap.parse_args(argv)
    ok = True
    print(
        f"{'index':7s} {'scenario':15s} {'exact/total':>12s} {'over':>5s} {'under':>5s}  rejected"
    )
    for kind in args.index or ["memory", "redis"]:
        for r in run_backend(kind, args.venv, args.vllm_venv, args.scenario):
            ok &= r["exact"] == r["total"] and not r["rejects"]
            print(
                f"{kind:7s} {r['scenario']:15s} {r['exact']:>5d}/{r['total']:<6d} "
                f"{r['over']:5d} {r['under']:5d}  {r['rejects'] or 0}",
                flush=True,
            )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
