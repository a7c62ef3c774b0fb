"""The cheap paths of the per-request routing work answer what the full computation would:
cached relative speeds follow every learned change, shared idle loads stay zero."""

from __future__ import annotations

from router.routing.speed import SpeedEstimator
from router.routing.state import InflightTable, WorkerLoad


def _learn(est: SpeedEstimator, worker: str, seconds: float, samples: int = 2) -> None:
    t = est.last_first_token(worker)
    t = 0.0 if t == float("-inf") else t
    for _ in range(samples):
        t += seconds
        est.observe(worker, dispatched=0.0, first_token=t, tokens=2000)


def test_cached_relative_speeds_follow_learned_changes_and_forgets() -> None:
    est = SpeedEstimator(nominal_tps=1000.0, min_samples=2, alpha=0.5)
    workers = ["a", "b", "c"]
    assert est.relative(workers) == {"a": 1.0, "b": 1.0, "c": 1.0}
    _learn(est, "a", 1.0, samples=1)  # one sample: still nominal
    assert est.relative(workers) == {"a": 1.0, "b": 1.0, "c": 1.0}
    _learn(est, "a", 1.0)  # 2000 tok/s against 1000 nominal
    fast = est.relative(workers)
    assert fast["a"] > 1.0 and fast == est._compute_relative(workers, 0.35)
    _learn(est, "a", 40.0, samples=6)  # slowed down: the cached answer must not stick
    slow = est.relative(workers)
    assert slow["a"] < 1.0 and slow == est._compute_relative(workers, 0.35)
    # Another worker list or dead band is another answer.
    assert est.relative(["a", "b"]) == est._compute_relative(["a", "b"], 0.35)
    assert est.relative(workers, dead_band=0.0) == est._compute_relative(workers, 0.0)
    est.forget("a")
    assert est.relative(workers) == {"a": 1.0, "b": 1.0, "c": 1.0}


def test_loads_for_shares_one_zero_record_for_idle_workers_and_drains_busy_ones() -> None:
    table = InflightTable(ttl=60.0, prefill_tps=100.0)
    table.add("r1", "busy", now=0.0, prefill_tokens=500.0, decode_tokens=10.0, tokens=600.0)
    idle1, busy, idle2 = table.loads_for(["idle1", "busy", "idle2"], now=2.0)
    assert idle1 is idle2 and idle1 == WorkerLoad()
    # Drained like load(): 500 - 2 s x 100 tok/s.
    assert busy.prefill_backlog == 300.0 == table.load("busy", 2.0).prefill_backlog
    assert (busy.requests, busy.decode_tokens, busy.tokens) == (1, 10.0, 600.0)
    table.finish("r1")
    assert table.loads_for(["busy"], now=3.0)[0] == WorkerLoad()
