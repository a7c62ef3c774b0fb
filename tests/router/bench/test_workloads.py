"""Workloads: deterministic token expansion, partial last blocks, preserved prefix sharing."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from router.bench.workloads import (
    MOONCAKE_BLOCK,
    MooncakeTrace,
    SyntheticConfig,
    segment_tokens,
    synthetic_workload,
)

TRACE = Path(__file__).resolve().parents[3] / "benchmarks/data/mooncake_conversation_trace.jsonl"


def _write(tmp_path: Path, rows: list[dict | str]) -> Path:
    path = tmp_path / "trace.jsonl"
    lines = [r if isinstance(r, str) else json.dumps(r) for r in rows]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_segment_tokens_deterministic_and_prefix_stable() -> None:
    a = segment_tokens([7, 8], [512, 512], seed=1)
    assert a == segment_tokens([7, 8], [512, 512], seed=1)
    assert a != segment_tokens([7, 8], [512, 512], seed=2)
    # A segment cut short is a prefix of the same segment at full length.
    assert segment_tokens([7, 8], [512, 100], seed=1) == a[:612]
    # A segment's tokens do not depend on what precedes it.
    assert segment_tokens([9, 8], [3, 512], seed=1)[3:] == a[512:]
    assert len(set(a)) > 400  # looks random, not constant
    assert all(100 <= t < 32_000 for t in a)


def test_segment_tokens_validates() -> None:
    with pytest.raises(ValueError):
        segment_tokens([1], [1, 2])
    with pytest.raises(ValueError):
        segment_tokens([1], [-1])
    assert segment_tokens([], []) == []


def test_mooncake_partial_last_block_and_shared_prefix(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        [
            {"timestamp": 1000, "input_length": 1100, "output_length": 5, "hash_ids": [0, 1, 2]},
            {"timestamp": 1500, "input_length": 1536, "output_length": 9, "hash_ids": [0, 1, 3]},
            {"timestamp": 2500, "input_length": 600, "output_length": 1, "hash_ids": [0, 4]},
        ],
    )
    trace = MooncakeTrace(path, seed=3)
    reqs = list(trace)
    assert [len(r.token_ids) for r in reqs] == [1100, 1536, 600]
    assert [r.arrival for r in reqs] == [0.0, 0.5, 1.5]
    assert [r.output_tokens for r in reqs] == [5, 9, 1]
    a, b, c = (r.token_ids for r in reqs)
    assert a[: 2 * MOONCAKE_BLOCK] == b[: 2 * MOONCAKE_BLOCK]  # ids 0, 1 shared
    assert a[1024:1100] != b[1024:1100]  # ids 2 vs 3 differ
    assert c[:512] == a[:512] and c[512:] != a[512:600]
    assert reqs[0].session_id == reqs[1].session_id != reqs[2].session_id
    # Re-iterating yields the very same tokens (expansion is a pure function).
    assert [r.token_ids for r in trace] == [a, b, c]


def test_mooncake_skips_bad_lines(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        [
            "not json",
            {"timestamp": 0, "input_length": 2000, "output_length": 1, "hash_ids": [0]},
            {"timestamp": 0, "input_length": 10, "output_length": 1},
            {"timestamp": 0, "input_length": 0, "output_length": 1, "hash_ids": []},
            {"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [5]},
        ],
    )
    trace = MooncakeTrace(path)
    assert trace.skipped == 4
    assert [len(r.token_ids) for r in trace] == [10]


def test_mooncake_real_trace_limit() -> None:
    trace = MooncakeTrace(TRACE, limit=50)
    assert len(trace) == 50 and trace.skipped == 0
    reqs = list(trace)
    first_block = {tuple(r.token_ids[:512]) for r in reqs}
    assert len(first_block) == 1  # block 0 is shared by every request of the trace
    lengths = [rec.input_length for rec in trace.records]
    assert [r.prompt_tokens for r in reqs] == lengths


def test_synthetic_deterministic_and_shapes() -> None:
    cfg = SyntheticConfig(requests=300, seed=5)
    a = synthetic_workload(cfg)
    assert a == synthetic_workload(cfg)
    assert a != synthetic_workload(SyntheticConfig(requests=300, seed=6))
    assert len(a) == 300
    assert all(x.arrival <= y.arrival for x, y in itertools.pairwise(a))
    assert {r.kind for r in a} == {"chat", "agent", "fanout"}
    assert len({r.request_id for r in a}) == 300


def _common_prefix(x: list[int], y: list[int]) -> int:
    n = 0
    for p, q in zip(x, y, strict=False):
        if p != q:
            break
        n += 1
    return n


def test_synthetic_sharing_patterns() -> None:
    reqs = synthetic_workload(SyntheticConfig(requests=400, seed=1))
    by_session: dict[str, list] = {}
    for r in reqs:
        by_session.setdefault(r.session_id, []).append(r)
    saw_chat = saw_fan = False
    for turns in by_session.values():
        kind = turns[0].kind
        if kind in ("chat", "agent") and len(turns) > 1:
            for prev, nxt in itertools.pairwise(turns):
                # Each turn's prompt extends the previous one (growing context).
                assert nxt.token_ids[: prev.prompt_tokens] == prev.token_ids
                assert nxt.prompt_tokens > prev.prompt_tokens
            saw_chat = True
        if kind == "fanout" and len(turns) > 1:
            shared = _common_prefix(turns[0].token_ids, turns[1].token_ids)
            assert shared >= 256 + 512  # system prompt + document
            assert turns[-1].arrival - turns[0].arrival < 0.1  # a burst
            saw_fan = True
    assert saw_chat and saw_fan
    # Shared system prompts: far fewer distinct first 256 tokens than sessions.
    firsts = {tuple(r.token_ids[:256]) for r in reqs}
    assert len(firsts) <= 3 < len(by_session)
