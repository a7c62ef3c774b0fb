"""``kvroute bench routing`` on bad flags: NaN, infinities, zeros and negatives, flags the
run would ignore or could not honour, and an unwritable ``--out`` are usage errors (exit 2,
one line naming the flag) before anything runs -- not NaN figures, a traceback after the
run, or a run that silently left the flag out."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest
from _bench_cli import run_bench

SMALL = ["--workers", "2", "--jobs", "1", "--policy", "kv_aware", "--policy", "llmd", "--json"]


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    path = tmp_path / "t.jsonl"
    rows = [
        {"timestamp": 50.0 * i, "input_length": 700, "output_length": 8, "hash_ids": [0, i % 3]}
        for i in range(16)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _bench(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    return run_bench(capsys, SMALL, *argv)


def _last(err: str) -> str:
    return err.strip().splitlines()[-1]


@pytest.mark.parametrize(
    "argv",
    [
        ["--load", "nan"],  # every TTFT NaN, exit 0
        ["--load", "inf"],
        ["--time-scale", "nan"],
        ["--time-scale", "inf"],
        ["--prefill-tps", "nan"],
        ["--prefill-tps", "0"],  # ZeroDivisionError in a job
        ["--prefill-tps", "inf"],
        ["--decode-s-per-token", "-1"],
        ["--decode-s-per-token", "nan"],
        ["--event-delay", "-1"],
        ["--event-delay", "nan"],
        ["--workers", "0"],  # "num_blocks must be positive"
        ["--gpu-blocks", "0"],
        ["--block-size", "0"],
        ["--jobs", "0"],  # silently one job
        ["--jobs", "-3"],
        ["--limit", "0"],  # a run of nothing
        ["--limit", "-1"],
        ["--engine-model", "charged", "--long-prefill-threshold", "-5"],
        ["--engine-model", "charged", "--worker-speeds", "1,nan"],
        ["--engine-model", "charged", "--worker-speeds", "1,inf"],
    ],
)
def test_numbers_no_run_can_use_are_usage_errors(
    trace: Path, capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    rc, out, err = _bench(capsys, "--trace", str(trace), *argv)
    flag = next(a for a in reversed(argv) if a.startswith("--"))
    assert rc == 2 and out == ""
    assert _last(err).startswith(f"kvroute bench routing: error: argument {flag}:")


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--synthetic", "20", "--limit", "5"], "--limit does not apply to --synthetic"),
        (["--synthetic", "20", "--time-scale", "2"], "--time-scale does not apply to --synthetic"),
        (["--synthetic", "20", "--trace", "x.jsonl"], "--trace does not apply to --synthetic"),
        (["--mix", "1,0,0"], "--mix weighs synthetic sessions"),
        (["--load", "0.5", "--time-scale", "2"], "give --time-scale or --load, not both"),
        (["--worker-speeds", "1,0.5"], "--worker-speeds needs --engine-model charged"),
        (["--long-prefill-threshold", "4096"], "--long-prefill-threshold needs --engine-model"),
        (["--engine-model", "charged", "--worker-speeds", "1,1,0.5"], "3 speeds for 2 workers"),
        (["--policy-setting", "llmd:kv_weight=nan"], "'kv_weight=nan' in 'llmd:kv_weight=nan'"),
        (["--policy-setting", "llmd:kv_weight=inf"], "'kv_weight=inf' in 'llmd:kv_weight=inf'"),
        (["--policy-setting", "llmd:queue_weight=-1"], "a finite number >= 0"),
        (["--weights", "decode=1,decode=2"], "weight 'decode' given twice"),
        (["--mix", "nan,1,1", "--synthetic", "20"], "--mix takes chat,agent,fanout weights"),
    ],
)
def test_flags_the_run_would_ignore_or_misread_are_usage_errors(
    trace: Path, capsys: pytest.CaptureFixture[str], argv: list[str], says: str
) -> None:
    source = [] if "--synthetic" in argv else ["--trace", str(trace)]
    rc, out, err = _bench(capsys, *source, *argv)
    assert rc == 2 and out == ""
    assert _last(err).startswith("kvroute bench routing: error: ") and says in _last(err)


@pytest.mark.parametrize(
    ("where", "says"),
    [("missing/x.json", "no directory"), (".", "is a directory"), ("", "needs a file name")],
)
def test_an_unwritable_out_is_refused_before_the_run(
    trace: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], where: str, says: str
) -> None:
    out_path = str(tmp_path / where) if where else ""
    rc, out, err = _bench(capsys, "--trace", str(trace), "--out", out_path)
    assert rc == 2 and out == ""  # refused before the run, not after it
    assert _last(err).startswith("kvroute bench routing: error: --out") and says in _last(err)


def test_an_out_that_fails_on_write_is_one_line_after_the_figures(
    trace: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def full(self: Path, *args: object, **kwargs: object) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self))

    monkeypatch.setattr(Path, "write_text", full)  # what no check before the run can see
    dest = tmp_path / "r.json"
    rc, out, err = _bench(capsys, "--trace", str(trace), "--out", str(dest))
    assert rc == 2
    assert json.loads(out)["config"]["requests"] == 16  # the figures are not lost
    assert _last(err) == f"kvroute bench: --out {dest}: No space left on device"


def test_good_flags_still_run(
    trace: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    dest = tmp_path / "r.json"
    argv = ["--engine-model", "charged", "--worker-speeds", "1,0.5", "--load", "0.5"]
    rc, out, err = _bench(capsys, "--trace", str(trace), *argv, "--out", str(dest))
    assert rc == 0, err
    assert json.loads(dest.read_text()) == json.loads(out)
    assert json.loads(out)["config"]["worker_speeds"] == [1.0, 0.5]
