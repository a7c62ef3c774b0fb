"""Per-client request rates (router/http/ratelimit.py): a token bucket per client address."""

from __future__ import annotations

from _helpers import serve_app

from router.config import RouterSettings
from router.http import create_app
from router.http.ratelimit import ClientRateLimiter


def test_bucket_refills_at_the_rate_and_is_per_client() -> None:
    lim = ClientRateLimiter(rate=10.0, burst=2)
    assert lim.allow("a", now=0.0) == 0.0
    assert lim.allow("a", now=0.0) == 0.0
    wait = lim.allow("a", now=0.0)
    assert 0.09 < wait <= 0.1 and lim.limited == 1
    assert lim.allow("b", now=0.0) == 0.0  # another client has its own bucket
    assert lim.allow("a", now=0.1) == 0.0  # one token back after 1/rate seconds
    assert lim.allow("a", now=0.1) > 0.0


def test_bucket_table_is_bounded() -> None:
    lim = ClientRateLimiter(rate=1.0, burst=1, max_clients=3)
    for i in range(10):
        lim.allow(f"c{i}", now=0.0)
    assert len(lim) == 3


async def test_over_the_rate_gets_429_json_and_is_counted_probes_never() -> None:
    app = create_app(settings=RouterSettings(client_rate_limit=0.5, client_rate_burst=2))
    async with serve_app(app) as client:
        codes = [(await client.get("/v1/workers")).status_code for _ in range(3)]
        assert codes == [200, 200, 429]
        r = await client.get("/v1/workers")
        assert r.status_code == 429 and r.json()["error"]["code"] == "rate_limited"
        assert r.json()["error"]["type"] == "Too Many Requests"  # as vLLM names a 429
        assert int(r.headers["retry-after"]) >= 1
        for _ in range(5):  # probes and scrapes are never limited
            assert (await client.get("/healthz")).status_code == 200
        metrics = (await client.get("/metrics")).text
        assert "kvroute_http_rate_limited_total 2.0" in metrics


async def test_zero_turns_it_off() -> None:
    app = create_app(settings=RouterSettings(client_rate_limit=0, client_rate_burst=1))
    async with serve_app(app) as client:
        for _ in range(5):
            assert (await client.get("/v1/workers")).status_code == 200
    assert not hasattr(app.state, "rate_limiter")
