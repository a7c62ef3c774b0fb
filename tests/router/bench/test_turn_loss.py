"""Previous turns evicted before the next: measured from the engines, alike for every policy."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from offload_core.kv_cache import KVCacheManager
from router.bench import main
from router.bench.turn_loss import TurnLoss, common_blocks
from schemas.hit_rule import GroupSpec

TRACE = Path(__file__).resolve().parents[3] / "benchmarks/data/mooncake_conversation_trace.jsonl"
GROUPS = [GroupSpec("full_attention", 4)]


def serve(kv: KVCacheManager, tokens: list[int]) -> None:
    """Prefill ``tokens`` on ``kv`` and finish: its full blocks stay cached, evictable."""
    plan = kv.begin(kv.make_request(tokens))
    kv.allocate(plan)
    kv.commit(plan)
    kv.finish(plan)


def test_common_blocks() -> None:
    assert common_blocks([b"a", b"b", b"c"], [b"a", b"b", b"x", b"y"]) == 2
    assert common_blocks([], [b"a"]) == 0


def test_a_kept_turn_an_evicted_turn_and_a_turn_still_in_prefill() -> None:
    engines = [KVCacheManager(GROUPS, 4), KVCacheManager(GROUPS, 4)]
    loss = TurnLoss(engines)
    first = list(range(12))  # three blocks
    r1 = engines[0].make_request(first)
    loss.check("s", r1)  # no previous turn: no sample
    loss.served("s", "t1", 0, r1)
    serve(engines[0], first)
    second = [*first, 100, 101, 102, 103]
    r2 = engines[0].make_request(second)
    loss.check("s", r2)  # t1's first token has not come: its blocks may not be stored
    assert loss.turns == 0
    loss.prefilled("t1")
    loss.check("s", r2)  # all three shared blocks still there
    assert (loss.turns, loss.turns_hit, loss.shared_tokens, loss.evicted_tokens) == (1, 0, 12, 0)
    loss.served("s", "t2", 0, r2)
    serve(engines[0], second)  # four blocks cached: the pool is full
    loss.prefilled("t2")
    # Another session needs two blocks: vLLM frees a request's blocks tail first, so the
    # session's last two blocks go and its first two stay.
    serve(engines[0], list(range(500, 508)))
    third = [*second, 7, 7, 7, 7]
    loss.check("s", engines[0].make_request(third))
    assert (loss.turns, loss.turns_hit) == (2, 1)
    assert loss.shared_tokens == 12 + 16
    assert loss.evicted_tokens == 8
    assert loss.summary() == {
        "prev_turn_tokens_evicted": round(8 / 28, 4),
        "prev_turns_evicted": 0.5,
        "prev_turn_samples": 2,
    }


def run(capsys: pytest.CaptureFixture[str], blocks: int) -> dict[str, Any]:
    argv = ["routing", "--trace", str(TRACE), "--limit", "600", "--workers", "2", "--jobs", "1"]
    argv += ["--engine-model", "charged", "--block-size", "512", "--gpu-blocks", str(blocks)]
    argv += ["--policy", "kv_aware", "--policy", "llmd", "--json"]
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)["policies"]  # type: ignore[no-any-return]


def test_every_policy_is_measured_alike(capsys: pytest.CaptureFixture[str]) -> None:
    """The anchors have no prefix memory, so the routing core's own loss rate sees only
    their admission reports; the engines' view samples their turns as it does kv_aware's."""
    tight, roomy = run(capsys, 1024), run(capsys, 100_000)
    for name in ("kv_aware", "llmd"):
        assert tight[name]["prev_turn_samples"] > 20, name
        assert 0.1 < tight[name]["prev_turn_tokens_evicted"] < 1.0, name
        assert 0.0 < tight[name]["queue_hit_tokens_lost"] < 1.0, name
        assert roomy[name]["prev_turn_samples"] > 20, name
        assert roomy[name]["prev_turn_tokens_evicted"] == 0.0, name
        assert roomy[name]["queue_hit_tokens_lost"] == 0.0, name
