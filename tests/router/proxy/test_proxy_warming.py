"""Prefix warming through the proxy (``warm_chunk``): a long prompt reaches a real
``kvroute engine`` as one-token requests for its first 64, 128, 192 tokens and then in
full, so the engine computes it a chunk at a time; short prompts go as they are. The
router runs the ``prefill-shaping`` route profile with ``warm_chunk`` 64 on top (the
profile's 8192 is for real prompts)."""

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
        mp.setenv("KVROUTE_ROUTE_PROFILE", "prefill-shaping")
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
    assert 'kvroute_route_config_info{policy="kv_aware",profile="prefill-shaping"} 1.0' in (
        router.metrics()
    )


def test_route_answers_the_warming_prefixes(router: RouterProc) -> None:
    body = {"token_ids": list(range(2000, 2200)), "request_id": "warm-route"}
    r = httpx.post(f"{router.url}/v1/route", json=body, timeout=10)
    assert r.status_code == 200, r.text
    assert r.json()["warm_prefixes"] == [64, 128, 192]
    done = httpx.post(f"{router.url}/v1/requests/warm-route/finish", timeout=10)
    assert done.status_code == 204


def test_a_long_chat_request_is_warmed_with_the_engines_own_tokens(router: RouterProc) -> None:
    """Chat: the warming requests carry the proxy's rendering of the chat template as token
    ids; the engine renders the chat request itself. Its cached tokens are every warmed
    token only if both renderings agree token for token."""
    engine = router.engines[0]
    before = engine.stats()
    sent_before = counter(router, "kvroute_proxy_warm_requests_total")
    words = " ".join(f"w{i}" for i in range(300))
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": words}]
    with openai.OpenAI(base_url=f"{router.url}/v1", api_key="x", max_retries=0) as client:
        reply = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=2)
    warmed = int(counter(router, "kvroute_proxy_warm_requests_total") - sent_before)
    assert warmed >= 2 and reply.usage is not None
    n = reply.usage.prompt_tokens
    assert 64 * warmed < n <= 64 * (warmed + 1)
    assert reply.usage.prompt_tokens_details.cached_tokens == 64 * warmed
    after = engine.stats()
    assert after["requests"] - before["requests"] == warmed + 1
    assert after["prompt_tokens"] - before["prompt_tokens"] == 32 * warmed * (warmed + 1) + n
