"""The proxy as users meet it: the official ``openai`` client pointed at ``kvroute serve``
in front of two ``kvroute engine`` processes (real sockets and processes throughout)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import openai
import pytest
from _fleet import MODEL, RouterProc, fleet, poll, shutdown, wait_caught_up

pytestmark = pytest.mark.timeout(300)

WORDS = "kabe dodo fifu hali mopa suvo " * 12


@pytest.fixture(scope="module")
def router(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RouterProc]:
    tmp = tmp_path_factory.mktemp("proxy")
    r = fleet(tmp, 2, "--token-delay-ms", "5")
    yield r
    shutdown(r)


@pytest.fixture
def client(router: RouterProc) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(
        base_url=f"{router.url}/v1", api_key="unused", max_retries=0, timeout=60
    ) as c:
        yield c


def test_completion_lands_where_the_cache_is_and_reports_the_engines_cached_tokens(
    client: openai.OpenAI, router: RouterProc
) -> None:
    first = client.completions.with_raw_response.create(
        model=MODEL, prompt=WORDS + "lolo", max_tokens=3
    )
    worker = first.headers["x-kvroute-worker"]
    assert first.headers["x-kvroute-hit-tokens"] == "0"
    assert first.parse().usage.prompt_tokens_details.cached_tokens == 0
    assert len(first.parse().choices[0].text.split()) == 3
    # The engine publishes as it answers: let the router apply it before the estimate.
    wait_caught_up(router, next(e for e in router.engines if e.worker_id == worker))
    again = client.completions.with_raw_response.create(
        model=MODEL, prompt=WORDS + "pela", max_tokens=3
    )
    cached = again.parse().usage.prompt_tokens_details.cached_tokens
    assert again.headers["x-kvroute-worker"] == worker
    # The router's estimate is the engine's reported hit: same tokenizer, exact index.
    assert cached > 0 and int(again.headers["x-kvroute-hit-tokens"]) == cached
    # Token-id prompts pass through untouched.
    ids = client.completions.create(model=MODEL, prompt=list(range(200, 300)), max_tokens=1)
    assert ids.usage.prompt_tokens == 100
    info = router.workers()[worker]
    assert info["estimates_compared"] >= 2 and info["estimate_exact_share"] == 1.0
    # The engine's report of a hit as estimated is a cache-pressure sample with no loss.
    metrics = router.metrics()
    assert 'kvroute_route_hits_lost_total{via="engine_report"} 0.0' in metrics
    reports = 'kvroute_route_hit_checks_total{via="engine_report"}'
    checks = next(ln for ln in metrics.splitlines() if ln.startswith(reports))
    assert float(checks.split()[-1]) >= 1
    # Nothing lost and (one request at a time) next to nothing queued: about half weight.
    weight = next(ln for ln in metrics.splitlines() if ln.startswith("kvroute_route_share_weight"))
    assert 0.5 <= float(weight.split()[-1]) < 0.75
    assert sum(w["inflight"] for w in router.workers().values()) == 0


def test_chat_streaming_and_not_with_n_and_usage(client: openai.OpenAI) -> None:
    messages = [
        {"role": "system", "content": "zuzu " * 40},
        {"role": "user", "content": "kabe dodo?"},
    ]
    reply = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=4, n=2)
    assert [c.index for c in reply.choices] == [0, 1]
    assert reply.choices[0].message.role == "assistant"
    assert len(reply.choices[0].message.content.split()) == 4
    assert reply.usage.completion_tokens == 8
    stream = client.chat.completions.create(
        model=MODEL,
        messages=messages,
        max_tokens=5,
        n=2,
        stream=True,
        stream_options={"include_usage": True},
    )
    text = {0: "", 1: ""}
    chunks = usage = 0
    for chunk in stream:
        chunks += 1
        for c in chunk.choices:
            text[c.index] += c.delta.content or ""
        if chunk.usage is not None:
            usage = chunk.usage
    assert chunks >= 12 and all(len(t.split()) == 5 for t in text.values())
    assert usage and usage.prompt_tokens == reply.usage.prompt_tokens
    # The second request repeated the first's prompt on the same worker: a cache hit.
    assert usage.prompt_tokens_details.cached_tokens > 0


def test_streaming_completion_passes_chunks_through(client: openai.OpenAI) -> None:
    stream = client.completions.create(model=MODEL, prompt="mopa " * 20, max_tokens=6, stream=True)
    pieces = [c.choices[0].text for c in stream if c.choices and c.choices[0].text]
    assert len(pieces) == 6
    # n and include_usage on completions too: both choices, then one usage chunk.
    stream = client.completions.create(
        model=MODEL,
        prompt="mopa " * 20,
        max_tokens=3,
        n=2,
        stream=True,
        stream_options={"include_usage": True},
    )
    text = {0: "", 1: ""}
    usage = None
    for chunk in stream:
        for c in chunk.choices:
            text[c.index] += c.text
        usage = chunk.usage or usage
    assert all(len(t.split()) == 3 for t in text.values())
    assert usage is not None and usage.completion_tokens == 6 and usage.prompt_tokens == 21


def test_client_cancel_mid_stream_cancels_the_engine_side(
    client: openai.OpenAI, router: RouterProc
) -> None:
    before = sum(e.stats()["streams_cancelled"] for e in router.engines)
    stream = client.completions.create(
        model=MODEL, prompt="suvo " * 30, max_tokens=5000, stream=True
    )
    for got, _ in enumerate(stream, 1):
        if got == 3:
            break
    stream.close()
    poll(
        lambda: sum(e.stats()["streams_cancelled"] for e in router.engines) > before,
        "the engine to see the cancelled stream",
    )
    poll(
        lambda: sum(w["inflight"] for w in router.workers().values()) == 0,
        "the router to release the cancelled request",
    )
    assert 'outcome="client_cancelled"' in router.metrics()
    poll(
        lambda: router.dashboard()["outcomes"].get("client_cancelled", 0) >= 1,
        "the dashboard counts the cancel",
    )


def test_unknown_model_is_a_clear_404(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as err:
        client.completions.create(model="no-such-model", prompt="hi")
    assert err.value.body["code"] == "model_not_found"
    assert "no-such-model" in err.value.body["message"] and MODEL in err.value.body["message"]
    # vLLM's error shape: the client reads the type and param as it does an engine's.
    assert (err.value.body["type"], err.value.body["param"]) == ("NotFoundError", None)
    assert err.value.type == "NotFoundError"


@pytest.mark.parametrize(
    ("path", "body", "status"),
    [
        ("/v1/completions", b"{not json", 400),
        ("/v1/completions", b"[1, 2]", 400),
        ("/v1/completions", b'{"model": 5, "prompt": "hi"}', 400),
        ("/v1/completions", b'{"model": "", "prompt": "hi"}', 400),
        ("/v1/completions", b'{"model": "kvroute-sim", "prompt": []}', 400),
        ("/v1/completions", b'{"model": "kvroute-sim", "prompt": [1, "x"]}', 400),
        ("/v1/chat/completions", b'{"model": "kvroute-sim", "messages": []}', 400),
        ("/v1/chat/completions", b'{"model": "kvroute-sim", "messages": [{"x": 1}]}', 400),
        ("/v1/completions", b'{"model": "kvroute-sim", "prompt": "hi", "n": 0}', 400),
    ],
)
def test_malformed_bodies_get_json_4xx(
    router: RouterProc, path: str, body: bytes, status: int
) -> None:
    r = httpx.post(router.url + path, content=body, timeout=30)
    assert r.status_code == status, r.text
    assert set(r.json()["error"]) >= {"code", "message"}
    if b'"n": 0' in body:  # the engine's answer, passed through: vLLM's shape
        assert r.json()["error"]["code"] == 400 and r.json()["error"]["param"] == "body.n", r.text
    else:  # the router's own
        assert r.json()["error"]["type"] == "BadRequestError", r.text


def test_models_and_tokenize_pass_through(client: openai.OpenAI, router: RouterProc) -> None:
    assert [m.id for m in client.models.list()] == [MODEL]
    r = httpx.post(f"{router.url}/tokenize", json={"model": MODEL, "prompt": "kabe dodo"})
    assert r.status_code == 200 and r.json()["tokens"][0] == 1  # BOS, then the words
    back = httpx.post(
        f"{router.url}/detokenize", json={"model": MODEL, "tokens": r.json()["tokens"]}
    )
    assert back.json()["prompt"] == "kabe dodo"
    assert r.headers["x-kvroute-worker"] in {e.worker_id for e in router.engines}
