"""Routing policies and routing state: baselines, load, ties, hot prefixes, predictions, TTL."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from _helpers import ScoreStub as Score

from router.routing.policy import (
    POLICY_NAMES,
    PolicyWeights,
    RouteInput,
    WorkerView,
    discount_hot,
    make_policy,
    pick_min,
)
from router.routing.state import (
    DuplicateRequestError,
    InflightTable,
    PrefixMemory,
    RoutingConfig,
    RoutingCore,
    WorkerLoad,
)

W = PolicyWeights()


def hits(**by_worker: int) -> list[Score]:
    return [Score(w, h, h, float(h)) for w, h in by_worker.items()]


def choose(name: str, views: list[WorkerView], n: int = 1000, seed: int = 0) -> str:
    choice = make_policy(name).choose(RouteInput(n), views, W, random.Random(seed))
    return views[choice.index].worker_id


def test_policy_registry() -> None:
    assert set(POLICY_NAMES) == {
        "kv_aware",
        "random",
        "round_robin",
        "least_loaded",
        "longest_prefix",
        "dynamo",
        "sglang",
        "sglang_smg",
        "llmd",
    }
    with pytest.raises(ValueError, match="unknown policy"):
        make_policy("fastest")


def test_random_is_seeded_and_uniformish() -> None:
    views = [WorkerView(f"w{i}") for i in range(4)]
    policy = make_policy("random")
    a = [policy.choose(RouteInput(10), views, W, rng).index for rng in [random.Random(1)] * 400]
    b = [policy.choose(RouteInput(10), views, W, rng).index for rng in [random.Random(1)] * 400]
    assert a == b
    counts = Counter(a)
    assert set(counts) == {0, 1, 2, 3} and min(counts.values()) > 60


def test_round_robin_cycles_in_id_order_and_survives_fleet_changes() -> None:
    policy = make_policy("round_robin")
    rng = random.Random(0)
    views = [WorkerView("b"), WorkerView("c"), WorkerView("a")]
    seq = [views[policy.choose(RouteInput(1), views, W, rng).index].worker_id for _ in range(4)]
    assert seq == ["a", "b", "c", "a"]
    views = [WorkerView("a"), WorkerView("c"), WorkerView("d")]  # b left, d joined
    seq = [views[policy.choose(RouteInput(1), views, W, rng).index].worker_id for _ in range(3)]
    assert seq == ["c", "d", "a"]


def test_least_loaded_ignores_hits() -> None:
    views = [
        WorkerView("busy", hit_tokens=900, score=900.0, inflight=3, prefill_backlog=3000),
        WorkerView("idle", inflight=1, prefill_backlog=100),
    ]
    assert choose("least_loaded", views) == "idle"


def test_longest_prefix_ignores_load() -> None:
    views = [
        WorkerView("busy", hit_tokens=900, score=900.0, inflight=50, prefill_backlog=1e6),
        WorkerView("idle", hit_tokens=100, score=100.0),
    ]
    assert choose("longest_prefix", views) == "busy"


def test_kv_aware_trades_affinity_against_load() -> None:
    cached = WorkerView("cached", hit_tokens=800, score=800.0)
    cold = WorkerView("cold")
    assert choose("kv_aware", [cached, cold]) == "cached"
    # The cached worker is busy enough that re-prefilling elsewhere is cheaper.
    busy = WorkerView("cached", hit_tokens=800, score=800.0, inflight=1, prefill_backlog=6000)
    assert choose("kv_aware", [busy, cold]) == "cold"
    # Tier weighting: CPU-resident hits (score < hit_tokens) are worth less than GPU hits.
    gpu = WorkerView("gpu", hit_tokens=500, hit_tokens_gpu=500, score=500.0)
    cpu = WorkerView("cpu", hit_tokens=550, hit_tokens_gpu=0, score=440.0)
    assert choose("kv_aware", [cpu, gpu]) == "gpu"


def test_balance_guard_drops_affinity_of_overloaded_worker() -> None:
    weights = PolicyWeights(backlog=0.0, decode=10.0, balance_slack=0.5, balance_floor=0.0)
    hot = WorkerView("hot", hit_tokens=900, score=900.0, inflight=10)
    others = [WorkerView(f"w{i}", inflight=1) for i in range(3)]
    policy = make_policy("kv_aware")
    # Mean load (10*10 + 3*10)/4 = 32.5; hot's 100 > 1.5 * mean: its hit no longer counts.
    choice = policy.choose(RouteInput(1000), [hot, *others], weights, random.Random(0))
    assert choice.index != 0
    relaxed = PolicyWeights(backlog=0.0, decode=10.0, balance_slack=5.0)
    choice = policy.choose(RouteInput(1000), [hot, *others], relaxed, random.Random(0))
    assert choice.index == 0


def test_ties_are_random_but_seeded() -> None:
    values = [5.0, 1.0, 1.0, 1.0 + 1e-12, 3.0]
    picks = {pick_min(values, random.Random(s)) for s in range(50)}
    assert picks == {1, 2, 3}
    assert pick_min(values, random.Random(7)) == pick_min(values, random.Random(7))
    views = [WorkerView(f"w{i}", hit_tokens=64, score=64.0) for i in range(3)]
    assert {choose("kv_aware", views, seed=s) for s in range(40)} == {"w0", "w1", "w2"}
    assert {choose("longest_prefix", views, seed=s) for s in range(40)} == {"w0", "w1", "w2"}


def test_discount_hot() -> None:
    assert discount_hot(1000.0, 0, 0.0) == 1000.0
    assert discount_hot(1000.0, 600, 0.0) == 400.0
    assert discount_hot(1000.0, 600, 0.5) == 700.0
    assert discount_hot(300.0, 600, 0.0) == 0.0


def test_inflight_table_accounting_and_ttl() -> None:
    table = InflightTable(ttl=10.0)
    table.add("a", "w1", now=0.0, prefill_tokens=100, decode_tokens=5)
    table.add("b", "w1", now=5.0, prefill_tokens=50, decode_tokens=5)
    with pytest.raises(DuplicateRequestError):
        table.add("a", "w2", now=1.0)
    load = table.load("w1")
    assert (load.requests, load.prefill_backlog, load.decode_tokens) == (2, 150, 10)
    assert table.expire(9.99) == 0 and len(table) == 2
    assert table.expire(10.0) == 1 and "a" not in table
    assert table.finish("a") is None  # expired: unknown now
    assert table.load("w1").requests == 1 and table.load("w1").prefill_backlog == 50
    assert table.finish("b") is not None
    assert table.load("w1").requests == 0 and table.expired == 1
    assert table.expire(100.0) == 0  # a finished request never expires later


def test_inflight_backlog_drains_at_the_prefill_rate() -> None:
    table = InflightTable(ttl=100.0, prefill_tps=10.0)
    table.add("a", "w", now=0.0, prefill_tokens=100)
    assert table.load("w", now=5.0).prefill_backlog == 50
    table.add("b", "w", now=5.0, prefill_tokens=30)
    assert table.load("w", now=6.0).prefill_backlog == 70
    assert table.load("w", now=60.0).prefill_backlog == 0  # prefilled; now decoding
    assert table.load("w").requests == 2
    table.finish("a")
    table.finish("b")
    assert table.load("w") == WorkerLoad()
    # Without a rate the backlog is exactly the unfinished requests' uncached tokens.
    exact = InflightTable(ttl=100.0)
    exact.add("a", "w", now=0.0, prefill_tokens=100)
    exact.add("b", "w", now=1.0, prefill_tokens=30)
    assert exact.load("w", now=50.0).prefill_backlog == 130
    exact.finish("a")
    assert exact.load("w", now=50.0).prefill_backlog == 30


def test_prefix_memory_keys() -> None:
    mem = PrefixMemory(block_tokens=4)
    k = mem.keys(list(range(10)))
    assert len(k) == 2  # the partial last chunk has no key
    assert mem.keys([*range(8), 99, 98, 97, 96])[:2] == k
    assert mem.keys([1, 2, 3, 4]) != mem.keys([1, 2, 3, 5])
    assert mem.keys([0, 1, 2, 3, 9, 9, 9, 9])[0] == k[0]


def test_routing_core_counts_and_finishes() -> None:
    clock = [0.0]
    core = RoutingCore(RoutingConfig(seed=1, inflight_ttl_s=30.0), clock=lambda: clock[0])
    d = core.route("r1", list(range(100)), hits(a=64, b=0))
    assert d.worker_id == "a" and d.hit_tokens == 64 and d.policy == "kv_aware"
    assert core.inflight.load("a").prefill_backlog == 36
    with pytest.raises(DuplicateRequestError):
        core.route("r1", list(range(100)), hits(a=64, b=0))
    assert core.finish("r1") is True and core.finish("r1") is False
    with pytest.raises(ValueError):
        core.route("r2", [1, 2], hits(a=0), policy="nope")
    with pytest.raises(ValueError):
        core.route("r2", [1, 2], [])


def test_routing_core_inflight_ttl_expires_lazily() -> None:
    clock = [0.0]
    weights = PolicyWeights(balance_slack=100.0)
    cfg = RoutingConfig(weights=weights, inflight_ttl_s=10.0, seed=0)
    core = RoutingCore(cfg, clock=lambda: clock[0])
    for i in range(3):
        core.route(f"r{i}", [i] * 50, hits(a=0, b=0), policy="least_loaded")
    assert len(core.inflight) == 3
    clock[0] = 9.0
    core.expire()
    assert len(core.inflight) == 3
    clock[0] = 10.5
    core.route("late", [7] * 50, hits(a=0, b=0))  # expiry happens on the next call
    assert len(core.inflight) == 1 and core.inflight.expired == 3
    assert core.finish("r0") is False


def _sys_requests(n: int, sys_len: int = 512, tail: int = 512) -> list[list[int]]:
    system = list(range(1, sys_len + 1))
    return [system + [10_000 + i] * tail for i in range(n)]


def test_hot_prefix_guard_spreads_a_shared_system_prompt() -> None:
    # No load term: only the cache term decides. Worker "a" alone holds the system prompt.
    base = dict(backlog=0.0, decode=0.0, held=0.0, share=0.0, balance_slack=1e9)
    workers = ["a", "b", "c", "d"]

    def run(discount: float) -> Counter[str]:
        weights = PolicyWeights(**base, hot_discount=discount)
        # predict_ttl_s=0: predictions die at once, isolating the guard from them.
        cfg = RoutingConfig(
            weights=weights, prefix_block_tokens=64, hot_min_requests=8, predict_ttl_s=0.0, seed=3
        )
        core = RoutingCore(cfg, clock=lambda: 0.0)
        out: Counter[str] = Counter()
        for i, tokens in enumerate(_sys_requests(80)):
            scores = [
                Score(w, 512 if w == "a" else 0, 0, 512.0 if w == "a" else 0.0) for w in workers
            ]
            out[core.route(f"r{i}", tokens, scores).worker_id] += 1
        return out

    unguarded = run(discount=1.0)
    assert unguarded == Counter({"a": 80})
    guarded = run(discount=0.0)
    assert set(guarded) == set(workers)
    assert guarded["a"] < 30  # only the warm-up requests before the prefix is known hot


def test_predicted_entries_group_a_burst_then_expire() -> None:
    clock = [0.0]
    weights = PolicyWeights(backlog=0.25, decode=0.0, held=0.0, share=0.0, balance_slack=1e9)
    # prefill_tps=0: the siblings' backlog stays on their worker (no draining).
    cfg = RoutingConfig(
        weights=weights, predict_ttl_s=2.0, prefix_block_tokens=16, prefill_tps=0.0, seed=5
    )
    core = RoutingCore(cfg, clock=lambda: clock[0])
    doc = list(range(5000, 7048))  # a new 2048-token document nobody has cached
    workers = hits(a=0, b=0, c=0, d=0)
    first = core.route("s0", [*doc, 1, 2, 3], workers).worker_id
    assert core.memory.predicted_entries == 128
    for i in range(1, 6):
        d = core.route(f"s{i}", [*doc, 10 * i, 11 * i], workers)
        assert d.worker_id == first
        assert d.predicted_tokens == 2048 and d.hit_tokens == 0  # hit_tokens stays the index's
    # Predictions expire after their TTL; the next sibling is placed on load alone.
    clock[0] = 2.5
    d = core.route("late", [*doc, 99], workers)
    assert d.predicted_tokens == 0 and d.worker_id != first
    assert core.memory.predicted_entries == 128  # re-remembered for the late sibling


def test_baselines_never_use_predictions() -> None:
    core = RoutingCore(RoutingConfig(seed=0), clock=lambda: 0.0)
    tokens = list(range(300))
    core.route("x", tokens, hits(a=0, b=0), policy="longest_prefix")
    assert core.memory.predicted_entries == 0


def test_one_policy_and_weights_check_serves_config_and_api() -> None:
    """config, `/v1/route` and the CLI share ``check_policy`` / ``policy_weights``."""
    from router.config import RouterSettings
    from router.routing.policy import check_policy, policy_weights

    assert check_policy("kv_aware") == "kv_aware"
    with pytest.raises(ValueError, match="expected one of"):
        check_policy("fastest")
    w = policy_weights({"decode": "128", "expected_output_tokens": 64.0})
    assert w.decode == 128.0 and w.expected_output_tokens == 64
    assert isinstance(w.expected_output_tokens, int)
    with pytest.raises(ValueError, match="unknown route weight"):
        policy_weights({"decoed": 1})
    with pytest.raises(ValueError, match="not a number"):
        policy_weights({"decode": "lots"})
    with pytest.raises(ValueError, match="unknown route weight"):
        RouterSettings(route_weights={"decoed": 1.0})
    with pytest.raises(ValueError, match="unknown policy"):
        RouterSettings(route_policy="fastest")
