"""``kvroute bench routing`` called in process, as the input tests call it."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from router.bench import main as bench_main


def run_bench(
    capsys: pytest.CaptureFixture[str], small: Sequence[str], *argv: str
) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of ``bench routing`` with ``small`` then ``argv``;
    a traceback on stderr fails the test."""
    try:
        rc = bench_main(["routing", *small, *argv])
    except SystemExit as exc:  # argparse's usage errors
        rc = int(exc.code or 0)
    out = capsys.readouterr()
    assert "Traceback" not in out.err
    return rc, out.out, out.err
