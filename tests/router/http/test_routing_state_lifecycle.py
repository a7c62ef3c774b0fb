"""The routing state follows the fleet: a removed worker takes its in-flight load and
its recent share with it (one registered again under its id starts as a new one), and
route weights that cannot price anything (NaN, infinities, negatives) are refused at
start-up instead of answering every request with a 500."""

from __future__ import annotations

import math

import pytest
from _helpers import FakeEngine, serve_app
from pydantic import ValidationError

from router.config import RouterSettings
from router.http import create_app

PROMPT = list(range(1, 2000))


async def test_a_removed_worker_takes_its_load_and_share_with_it() -> None:
    engines = [FakeEngine(), FakeEngine()]
    app = create_app(settings=RouterSettings(replay_timeout_s=1.0))
    try:
        async with serve_app(app) as c:
            for i, e in enumerate(engines):
                assert (await c.post("/v1/workers", json=e.spec(f"w{i}"))).status_code == 201
            for i in range(3):
                body = {"token_ids": PROMPT, "request_id": f"r{i}", "workers": ["w1"]}
                assert (await c.post("/v1/route", json=body)).status_code == 200
            assert 'kvroute_route_inflight{worker="w1"} 3.0' in (await c.get("/metrics")).text
            assert (await c.delete("/v1/workers/w1")).status_code == 204
            assert (
                'worker="w1"'
                not in (await c.get("/metrics"))
                .text.split("kvroute_route_inflight", 1)[1]
                .split("# HELP", 1)[0]
            )
            core = app.state.service.routing
            assert "w1" not in core.recent
            # Registered again: idle, and its old requests are not its load.
            assert (await c.post("/v1/workers", json=engines[1].spec("w1"))).status_code == 201
            r = await c.post("/v1/route", json={"token_ids": PROMPT, "policy": "least_loaded"})
            loads = {x["worker_id"]: x["load"] for x in r.json()["candidates"]}
            assert loads == {"w0": 0.0, "w1": 0.0}, loads
            r = await c.post("/v1/requests/r0/finish")  # its worker is gone: unknown now
            assert r.status_code == 404
    finally:
        for e in engines:
            await e.close()


@pytest.mark.parametrize(
    "weights",
    [{"warm_chunk": math.nan}, {"held": math.nan}, {"prefill": math.inf}, {"share_window": -1}],
)
def test_route_weights_that_price_nothing_are_refused(weights: dict[str, float]) -> None:
    with pytest.raises(ValidationError, match="finite number >= 0"):
        RouterSettings(route_weights=weights)
