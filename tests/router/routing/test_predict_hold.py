"""Predicted prefixes held until the request's prefill is done
(``PolicyWeights.predict_hold``; docs/routing.md, "Predicted entries").

A turn that waits in its engine's queue longer than the prediction TTL is in no index yet;
its session's next turn must still find the worker it went to (round 20: the Mooncake
N=32 tight cells lost long sessions this way)."""

from __future__ import annotations

from _helpers import ScoreStub as Score

from router.routing.policy import PolicyWeights
from router.routing.prefix_memory import PrefixMemory
from router.routing.state import RoutingConfig, RoutingCore

WORKERS = ("a", "b", "c", "d")


def make(clock: list[float], until_prefilled: bool = True) -> RoutingCore:
    hold = 1.0 if until_prefilled else 0.0
    weights = PolicyWeights(share=0.0, held=0.0, balance_slack=1e9, predict_hold=hold)
    config = RoutingConfig(
        weights=weights, predict_ttl_s=3.0, prefix_block_tokens=16, prefill_tps=0.0, seed=1
    )
    return RoutingCore(config, clock=lambda: clock[0])


def empty() -> list[Score]:
    return [Score(w) for w in WORKERS]  # nothing in any index yet


def warm(core: RoutingCore) -> None:
    """One finished request: the caller reports finishes, so holding is safe."""
    core.route("warmup", list(range(900_000, 900_040)), empty())
    core.finish("warmup")


def test_a_turn_still_queued_past_the_ttl_keeps_its_worker_for_the_next_turn() -> None:
    turn1 = list(range(2000))
    turn2 = [*turn1, *range(5000, 5200)]
    for until_prefilled, kept in ((True, True), (False, False)):
        clock = [0.0]
        core = make(clock, until_prefilled)
        warm(core)
        first = core.route("t1", turn1, empty())  # queued: no first token yet
        clock[0] = 10.0  # far past the 3 s TTL
        second = core.route("t2", turn2, empty())
        assert (second.predicted_tokens == 2000) is kept
        assert (second.worker_id == first.worker_id) is kept


def test_the_prediction_lasts_the_ttl_after_the_first_token() -> None:
    clock = [0.0]
    core = make(clock)
    warm(core)
    prompt = list(range(1024))
    worker = core.route("t1", prompt, empty()).worker_id
    clock[0] = 30.0
    assert core.first_token("t1")
    keys = core.memory.keys(prompt)
    assert core.memory.predicted(keys, 32.9) == {worker: 1024}
    clock[0] = 33.1  # first token + 3 s: the index has the prefix by now
    core.expire()
    assert core.memory.predicted(keys, 33.1) == {}
    assert core.memory.predicted_entries == 0


def test_a_router_whose_callers_never_report_keeps_the_fixed_ttl() -> None:
    # Nothing would ever end the hold: a /v1/route caller that never calls finish.
    clock = [0.0]
    core = make(clock)
    prompt = list(range(1024))
    core.route("t1", prompt, empty())
    clock[0] = 3.5
    assert core.route("t2", [*prompt, 7], empty()).predicted_tokens == 0


def test_a_held_prediction_ends_with_the_inflight_ttl_and_leaves_nothing_behind() -> None:
    clock = [0.0]
    core = make(clock)
    warm(core)
    core.route("lost", list(range(1024)), empty())  # its finish never comes
    clock[0] = core.config.inflight_ttl_s + 1.0
    assert core.expire() == 1
    assert core.memory.predicted_entries == 0 and not core._held


def test_release_leaves_entries_a_later_request_took_over() -> None:
    memory = PrefixMemory(block_tokens=4, predict_ttl=3.0)
    keys = memory.keys(list(range(16)))
    held = memory.remember(keys, "a", 0.0, hold=120.0)
    memory.remember(keys[:2], "b", 1.0)  # a later request sent the first two blocks to b
    memory.release(keys, "a", held, 5.0)
    assert memory.predicted(keys, 5.5) == {}  # b's entries expired at 4.0 and stop the chain
    assert memory.predicted(keys[2:], 5.5) == {"a": 8}
    memory.expire(8.1)
    assert memory.predicted_entries == 0
