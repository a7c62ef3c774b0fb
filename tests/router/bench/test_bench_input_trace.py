"""``kvroute bench routing`` on bad traces: an empty or unusable trace is an error (exit 2),
not a run of 0.0 figures; lines out of order are replayed in arrival order; hash ids
beyond uint64 are skipped as malformed (not an OverflowError); skipped lines are named
with the figures; ``--load`` that cannot be met is an error, not an unscaled run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from _bench_cli import run_bench

from router.bench.workloads import MooncakeTrace

SMALL = ["--workers", "2", "--jobs", "1", "--policy", "kv_aware", "--policy", "random", "--json"]


def _row(ts: float, n: int, ids: list[int], out: int = 4) -> dict[str, Any]:
    return {"timestamp": ts, "input_length": n, "output_length": out, "hash_ids": ids}


def _rows() -> list[dict[str, Any]]:
    """24 requests over four conversations that share block 0, 40 ms apart."""
    rows = []
    for i in range(24):
        conv, turn = i % 4, i // 4 + 1
        ids = [0] + [100 * conv + j for j in range(1, turn + 1)]
        rows.append(_row(40.0 * i, 512 * turn + 100, ids, out=8))
    return rows


def _write(path: Path, rows: list[dict[str, Any] | str]) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def _bench(
    capsys: pytest.CaptureFixture[str], *argv: str
) -> tuple[int, dict[str, Any] | None, str]:
    rc, out, err = run_bench(capsys, SMALL, *argv)
    return rc, (json.loads(out) if rc == 0 else None), err


@pytest.mark.parametrize(
    "content",
    ["", "\n  \n", "not json\n{bad\n[1, 2]\n", json.dumps(_row(0, 0, [])) + "\n"],
    ids=["empty", "blank", "garbage", "empty-prompt"],
)
def test_a_trace_with_no_usable_line_is_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str
) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(content)
    rc, result, err = _bench(capsys, "--trace", str(path))
    assert rc == 2 and result is None
    assert err.strip().splitlines()[-1].startswith(f"kvroute bench: {path}: no valid lines")


def test_a_slice_with_no_request_is_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _write(tmp_path / "t.jsonl", list(_rows()))
    rc, _, err = _bench(capsys, "--trace", str(path), "--slice", "0:0.01")
    assert rc == 2 and "--slice 0:0.01 of 24 requests is empty" in err


def test_skipped_lines_are_named_with_the_figures(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows: list[dict[str, Any] | str] = [*_rows()]
    rows[3:3] = ["not json", json.dumps({**_row(0, 10, [1]), "hash_ids": ["x"]})]
    rc, result, _ = _bench(capsys, "--trace", str(_write(tmp_path / "t.jsonl", rows)))
    assert rc == 0 and result is not None
    assert result["config"]["requests"] == 24
    assert result["config"]["workload"] == "t.jsonl (24 requests, 2 malformed lines skipped)"


def test_lines_out_of_order_replay_as_the_sorted_trace(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = _rows()
    rc, ordered, _ = _bench(capsys, "--trace", str(_write(tmp_path / "a.jsonl", list(rows))))
    rc2, shuffled, _ = _bench(
        capsys, "--trace", str(_write(tmp_path / "b.jsonl", list(reversed(rows))))
    )
    assert rc == rc2 == 0 and ordered is not None and shuffled is not None
    # Reversed, every line but the first arrived "before" the trace began and queued
    # behind later work, inflating every TTFT.
    for name in ("kv_aware", "random"):
        for key in ("hit_rate", "ttft_mean_s", "ttft_p99_s"):
            assert shuffled["policies"][name][key] == ordered["policies"][name][key]


def test_records_are_in_arrival_order_from_the_earliest(tmp_path: Path) -> None:
    path = _write(
        tmp_path / "t.jsonl", [_row(3000, 10, [1]), _row(1000, 10, [2]), _row(2000, 10, [3])]
    )
    trace = MooncakeTrace(path)
    assert [r.arrival for r in trace.records] == [0.0, 1.0, 2.0]
    assert [r.hash_ids for r in trace.records] == [(2,), (3,), (1,)]
    assert [r.index for r in trace.records] == [0, 1, 2]


def test_hash_ids_beyond_uint64_are_skipped_not_fatal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows: list[dict[str, Any] | str] = [
        *_rows(),
        _row(5000, 10, [2**64]),
        _row(5001, 10, [2**64 - 1]),
    ]
    path = _write(tmp_path / "t.jsonl", rows)
    trace = MooncakeTrace(path)
    assert trace.skipped == 1 and len(trace) == 25
    rc, result, err = _bench(capsys, "--trace", str(path))
    assert rc == 0 and result is not None, err
    assert result["config"]["requests"] == 25


def test_load_on_requests_that_all_arrive_at_once_is_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = [{**r, "timestamp": 0} for r in _rows()]
    path = _write(tmp_path / "t.jsonl", list(rows))
    # Unscaled, these figures were reported as "load 0.5 (arrivals x1)".
    rc, _, err = _bench(capsys, "--trace", str(path), "--load", "0.5")
    assert rc == 2 and "--load needs requests that arrive at different times" in err
