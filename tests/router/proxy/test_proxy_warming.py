"""Prefix warming through the proxy (``warm_chunk``): a long prompt reaches a real
``kvroute engine`` as one-token requests for its first 64, 128, 192 tokens and then in
full, so the engine computes it a chunk at a time; short prompts go as they are."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import openai
import pytest
from _fleet import MODEL, RouterProc, fleet, shutdown

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def router(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RouterProc]:
    tmp = tmp_path_factory.mktemp("warming")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("KVROUTE_ROUTE_WEIGHTS", '{"warm_chunk": 64}')
        r = fleet(tmp, 1)
    yield r
    shutdown(r)


def counter(router: RouterProc, name: str) -> float:
    line = next(ln for ln in router.metrics().splitlines() if ln.startswith(name + " "))
    return float(line.split()[-1])


def test_a_long_prompt_is_warmed_a_chunk_at_a_time(router: RouterProc) -> None:
    engine = router.engines[0]
    before = engine.stats()
    with openai.OpenAI(base_url=f"{router.url}/v1", api_key="x", max_retries=0) as client:
        long = client.completions.create(model=MODEL, prompt=list(range(500, 700)), max_tokens=2)
        # The warming requests cached the first 192 tokens: the request computes 8.
        assert long.usage.prompt_tokens_details.cached_tokens == 192
        after = engine.stats()
        assert after["requests"] - before["requests"] == 4
        assert after["prompt_tokens"] - before["prompt_tokens"] == 64 + 128 + 192 + 200
        assert counter(router, "kvroute_proxy_warm_requests_total") == 3
        assert 'kvroute_proxy_warmings_total{outcome="done"} 1.0' in router.metrics()
        # A prompt with at most one chunk to compute goes as it is.
        short = client.completions.create(model=MODEL, prompt=list(range(500, 750)), max_tokens=1)
        assert short.usage.prompt_tokens_details.cached_tokens == 192
        assert engine.stats()["requests"] - after["requests"] == 1
    assert counter(router, "kvroute_proxy_warm_requests_total") == 3


def test_route_answers_the_warming_prefixes(router: RouterProc) -> None:
    body = {"token_ids": list(range(2000, 2200)), "request_id": "warm-route"}
    r = httpx.post(f"{router.url}/v1/route", json=body, timeout=10)
    assert r.status_code == 200, r.text
    assert r.json()["warm_prefixes"] == [64, 128, 192]
    done = httpx.post(f"{router.url}/v1/requests/warm-route/finish", timeout=10)
    assert done.status_code == 204
