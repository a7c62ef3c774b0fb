"""The anchors' published decision rules, case by case, and the learned prefill speed."""

from __future__ import annotations

import random

import pytest

from router.routing.policy import (
    EngineStats,
    PolicyWeights,
    RouteInput,
    WorkerView,
    make_policy,
    parse_policy_settings,
)
from router.routing.speed import SpeedEstimator
from router.routing.state import RoutingConfig, RoutingCore

W = PolicyWeights()


def pick(name: str, views: list[WorkerView], n: int = 1000, block: int = 16) -> str:
    choice = make_policy(name).choose(RouteInput(n, 0, block), views, W, random.Random(0))
    return views[choice.index].worker_id


def test_dynamo_adds_prefill_and_decode_blocks() -> None:
    # a: 600 cached but 4000 active prompt tokens; b: nothing cached, idle.
    a = WorkerView("a", hit_tokens=600, hit_tokens_gpu=600, inflight_tokens=4000)
    b = WorkerView("b")
    assert pick("dynamo", [a, b]) == "b"  # (400+1000+4000)/16 > (1000+1000)/16
    a = WorkerView("a", hit_tokens=600, hit_tokens_gpu=600, inflight_tokens=100)
    assert pick("dynamo", [a, b]) == "a"
    # Host-tier overlap is credited at 0.75 of a device block.
    gpu = WorkerView("gpu", hit_tokens=400, hit_tokens_gpu=400)
    cpu = WorkerView("cpu", hit_tokens=500, hit_tokens_gpu=0)
    assert pick("dynamo", [gpu, cpu]) == "gpu"  # 375 credited < 400


def test_sglang_gate_follows_the_match_threshold_and_the_balance_rule() -> None:
    cached = WorkerView("cached", hit_tokens=600, inflight=3)
    small = WorkerView("small", engine=EngineStats(cached_blocks=1), inflight=1)
    big = WorkerView("big", engine=EngineStats(cached_blocks=9), inflight=1)
    assert pick("sglang", [cached, small, big]) == "cached"  # 0.6 > 0.5
    weak = WorkerView("cached", hit_tokens=400, inflight=3, engine=EngineStats(cached_blocks=5))
    assert pick("sglang", [weak, small, big]) == "small"  # 0.4: smallest tree
    assert pick("sglang_smg", [weak, small, big]) == "cached"  # SMG: 0.4 > 0.3
    # Imbalanced (abs > 32 and rel > 1.1): the least loaded, whatever is cached.
    hot = WorkerView("hot", hit_tokens=999, inflight=40)
    idle = WorkerView("idle", inflight=5)
    assert pick("sglang", [hot, idle]) == "idle"
    assert pick("sglang_smg", [hot, idle]) == "hot"  # SMG: 35 <= 64, not imbalanced


def test_llmd_weighs_prefix_queue_and_kv_usage() -> None:
    cached = WorkerView("cached", score=500.0, engine=EngineStats(queue_depth=4, kv_usage=0.9))
    free = WorkerView("free", engine=EngineStats(queue_depth=0, kv_usage=0.1))
    # 3*0.5 + 0 + 2*0.1 = 1.7 vs 0 + 2 + 1.8 = 3.8
    assert pick("llmd", [cached, free]) == "free"
    cached = WorkerView("cached", score=900.0, engine=EngineStats(queue_depth=0, kv_usage=0.5))
    free = WorkerView("free", engine=EngineStats(queue_depth=0, kv_usage=0.1))
    assert pick("llmd", [cached, free]) == "cached"  # 2.7+2+1.0 > 0+2+1.8


def test_anchor_settings_change_the_rule_and_are_checked() -> None:
    cached = WorkerView("cached", score=500.0, engine=EngineStats(queue_depth=4, kv_usage=0.9))
    free = WorkerView("free", engine=EngineStats(queue_depth=0, kv_usage=0.1))
    # Prefix weighed 10: 5 + 0 + 0.2 > 0 + 2 + 1.8.
    llmd = make_policy("llmd", {"prefix_weight": 10})
    choice = llmd.choose(RouteInput(1000, 0, 16), [cached, free], W, random.Random(0))
    assert choice.index == 0 and make_policy("llmd").prefix_weight == 3.0
    weak = WorkerView("cached", hit_tokens=400, inflight=3, engine=EngineStats(cached_blocks=5))
    small = WorkerView("small", engine=EngineStats(cached_blocks=1), inflight=1)
    sglang = make_policy("sglang", {"cache_threshold": 0.3})
    assert sglang.choose(RouteInput(1000), [weak, small], W, random.Random(0)).index == 0
    with pytest.raises(ValueError, match="unknown setting"):
        make_policy("dynamo", {"prefix_weight": 1})
    with pytest.raises(ValueError, match="kv_aware takes weights"):
        make_policy("kv_aware", {"held": 1})
    assert parse_policy_settings(
        ["llmd:kv_weight=1,queue_weight=3", "dynamo:host_hit_weight=1"]
    ) == {
        "llmd": {"kv_weight": 1.0, "queue_weight": 3.0},
        "dynamo": {"host_hit_weight": 1.0},
    }
    # A NaN or infinite weight made every score NaN; a negative one inverted its term.
    bad_values = ("llmd:kv_weight=nan", "llmd:kv_weight=inf", "llmd:kv_weight=-1")
    for bad in ("llmd", "llmd:kv_weight", "llmd:kv_weight=x", "nope:a=1", *bad_values):
        with pytest.raises(ValueError):
            parse_policy_settings([bad])
    # The routing core makes its policies with the config's settings.
    core = RoutingCore(RoutingConfig(policy_settings={"llmd": {"kv_weight": 0.5}}))
    assert core.policy("llmd").kv_weight == 0.5  # type: ignore[attr-defined]
    with pytest.raises(ValueError):
        RoutingCore(RoutingConfig(policy_settings={"llmd": {"bogus": 1.0}}))


def test_speed_estimator_learns_a_busy_worker_rate() -> None:
    est = SpeedEstimator(nominal_tps=1000.0, min_samples=2, alpha=0.5)
    assert est.speed("w") == 1.0
    t = 0.0
    for _ in range(10):  # back to back: 2000 tokens every 4 s = 500 tok/s
        est.observe("w", dispatched=0.0, first_token=t + 4.0, tokens=2000)
        t += 4.0
    assert abs(est.tps("w") - 500.0) < 1e-6
    est.observe("fast", 0.0, 1.0, 2000)
    est.observe("fast", 0.0, 2.0, 2000)
    rel = est.relative(["w", "fast"])
    assert rel["fast"] > 1.0 > rel["w"]
    # Tiny prefills (cache hits) are not samples.
    est.observe("x", 0.0, 1.0, 10)
    assert est.tps("x") == 1000.0


def test_first_token_moves_the_backlog_and_teaches_the_speed() -> None:
    core = RoutingCore(RoutingConfig(prefill_tps=0.0, prefix_block_tokens=4, seed=1))

    class S:
        def __init__(self, w: str) -> None:
            self.worker_id, self.hit_tokens, self.hit_tokens_gpu, self.score = w, 0, 0, 0.0

    d = core.route("r1", list(range(2000)), [S("a")], now=0.0)
    assert core.inflight.load("a").prefill_backlog == 2000
    assert core.inflight.load("a").tokens == 2000
    assert core.first_token("r1", now=2.0)
    assert core.inflight.load("a").prefill_backlog == 0
    assert core.inflight.load("a").requests == 1  # still decoding
    assert core.finish("r1", now=3.0) and core.inflight.load("a").tokens == 0
    assert not core.first_token("r1", now=4.0)
    assert d.worker_id == "a"
