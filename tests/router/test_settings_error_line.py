"""docs/router.md: "Invalid settings exit with status 2 and a one-line reason" -- for a
setting pydantic rejects too, where the message used to be pydantic's four lines (model,
field, message, documentation URL). Real ``kvroute serve`` processes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def serve(*args: str, **kvroute_env: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVROUTE_")}
    env.update({f"KVROUTE_{k.upper()}": v for k, v in kvroute_env.items()})
    return subprocess.run(
        [sys.executable, "-m", "router.cli", "serve", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def reason_line(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr and "errors.pydantic.dev" not in proc.stderr
    return lines[0]


def test_an_invalid_setting_is_one_line_naming_it() -> None:
    line = reason_line(serve("--max-workers", "0"))
    assert line == (
        "kvroute serve: invalid settings: max_workers: Input should be greater than or equal to 1"
    )


def test_several_invalid_settings_are_joined_on_one_line() -> None:
    line = reason_line(serve("--max-workers", "0", "--port", "70000"))
    assert line.startswith("kvroute serve: invalid settings: "), line
    assert "max_workers: Input should be greater than or equal to 1" in line
    assert "port: Input should be less than or equal to 65535" in line
    assert "; " in line


@pytest.mark.parametrize(
    "args",
    [
        ("--worker", "w0=not-an-endpoint"),  # the worker spec's own model
        ("--tier-weights", '{"GPU": "x"}'),  # a nested field
    ],
)
def test_other_invalid_values_are_one_line_too(args: tuple[str, ...]) -> None:
    line = reason_line(serve(*args))
    assert line.startswith("kvroute serve: invalid settings: "), line


def test_an_invalid_environment_setting_is_one_line_too() -> None:
    line = reason_line(serve(max_workers="0"))
    assert line == (
        "kvroute serve: invalid settings: max_workers: Input should be greater than or equal to 1"
    )
