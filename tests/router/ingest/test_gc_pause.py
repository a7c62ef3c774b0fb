"""``gc_paused``: the collector is off inside, back on after (errors too), and a
collector the application turned off stays off."""

from __future__ import annotations

import gc

import pytest

from router.ingest.gc_pause import gc_paused


def test_paused_inside_and_back_after() -> None:
    assert gc.isenabled()
    with gc_paused():
        assert not gc.isenabled()
        with gc_paused():  # nested: still off, and the outer one restores
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()


def test_back_on_after_an_error() -> None:
    with pytest.raises(RuntimeError), gc_paused():
        raise RuntimeError("boom")
    assert gc.isenabled()


def test_a_disabled_collector_stays_disabled() -> None:
    gc.disable()
    try:
        with gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()
