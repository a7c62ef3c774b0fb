"""Conformance test set-up: the repo root on ``sys.path`` (``conformance/`` is plain scripts,
not an installed package) and the per-scenario exact/total table after the run."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = str(Path(__file__).resolve().parents[2])
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    import test_vllm_recordings as t

    if not t.OUTCOMES:
        return
    terminalreporter.section("vLLM 0.33 conformance (probes exact/total)")
    for backend, out in t.OUTCOMES:
        terminalreporter.write_line(f"{backend:11s} {out.line()}")
