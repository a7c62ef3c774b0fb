"""Prints the per-scenario exact/total table of the vLLM replay tests after the run."""

from __future__ import annotations

import pytest


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    import test_vllm_recordings as t

    if not t.OUTCOMES:
        return
    terminalreporter.section("vLLM 0.33 conformance (probes exact/total)")
    for backend, out in t.OUTCOMES:
        terminalreporter.write_line(f"{backend:11s} {out.line()}")
