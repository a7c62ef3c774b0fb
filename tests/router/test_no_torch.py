"""The router's install has no torch: nothing on its import paths may load it."""

from __future__ import annotations

import subprocess
import sys

ROUTER_MODULES = (
    "router.cli",
    "router.serve",
    "router.http.app",
    "router.ops.demo",
    "router.bench",
    "router.ops.tail",
    "schemas.hashing",
    "schemas.hit_rule",
    "offload_core.kv_cache",
    "publisher",
    "schemas",
)


def test_router_paths_never_import_torch() -> None:
    code = (
        "import sys\n"
        f"for m in {ROUTER_MODULES!r}: __import__(m)\n"
        "from router.http import create_app\n"
        "create_app()\n"
        "print('torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_engine_does_import_torch() -> None:
    """The check above can fail: the engine's module does load torch."""
    code = "import sys, offload_core.engine; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "True"
