"""``RateLimitedLog``: a repeating fault stays visible, with counts, without flooding."""

from __future__ import annotations

import logging

import pytest

from router.ratelimited_log import RateLimitedLog


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def setup(
    caplog: pytest.LogCaptureFixture,
) -> tuple[RateLimitedLog, Clock, pytest.LogCaptureFixture]:
    clock = Clock()
    logger = logging.getLogger("test.ratelimited")
    caplog.set_level(logging.INFO, logger="test.ratelimited")
    return RateLimitedLog(logger, burst=3, interval_s=10.0, clock=clock), clock, caplog


def test_burst_then_one_line_per_interval_with_suppressed_count(setup):
    limited, clock, caplog = setup
    logged = [limited.warning("k", "bad frame %d", i) for i in range(10)]
    assert logged == [True] * 3 + [False] * 7
    assert [r.getMessage() for r in caplog.records] == [f"bad frame {i}" for i in range(3)]
    clock.t += 10.0
    assert limited.warning("k", "bad frame %d", 10)
    last = caplog.records[-1]
    assert last.getMessage() == "bad frame 10 [7 similar suppressed in 10s]"
    assert last.suppressed == 7  # structured field for JSON logs
    assert last.levelno == logging.WARNING
    # The fault keeps being reported as long as it lasts (not "once per process").
    clock.t += 5.0
    assert not limited.warning("k", "bad frame")
    clock.t += 5.0
    assert limited.warning("k", "bad frame")
    assert caplog.records[-1].getMessage().endswith("[1 similar suppressed in 10s]")
    assert limited.count("k") == 13


def test_keys_are_independent_and_bounded(caplog: pytest.LogCaptureFixture):
    caplog.set_level(logging.INFO, logger="test.keys")
    limited = RateLimitedLog(logging.getLogger("test.keys"), burst=1, interval_s=60, max_keys=2)
    assert limited.info("a", "a")
    assert limited.info("b", "b")
    assert not limited.info("a", "a again")
    assert limited.info("c", "c")  # evicts the oldest key ("a")
    assert set(limited.counts) == {"b", "c"}
    assert limited.info("a", "a is new again")


def test_call_site_is_reported(setup):
    limited, _, caplog = setup
    limited.error("k", "x")
    limited.log(logging.ERROR, "k2", "y")
    assert {r.funcName for r in caplog.records} == {"test_call_site_is_reported"}
    assert {r.filename for r in caplog.records} == {"test_ratelimited_log.py"}


def test_exception_includes_traceback(setup):
    limited, _, caplog = setup
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        limited.exception("k", "failed")
    assert caplog.records[-1].exc_info is not None


def test_invalid_arguments():
    with pytest.raises(ValueError):
        RateLimitedLog(logging.getLogger("x"), burst=-1)
