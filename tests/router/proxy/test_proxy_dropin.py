"""The proxy as a drop-in in front of vLLM engines, with real processes (light engines:
benchmarks/light_engines.py) and the official ``openai`` client: what an experienced
user's set-up sends reaches the engine, and what the engine answers reaches the client
the way vLLM's own server would give it."""

from __future__ import annotations

from pathlib import Path

import httpx
import openai
import pytest
from _fleet import MODEL, poll, start_light, start_router, stop, wait_live

pytestmark = pytest.mark.timeout(300)

PROMPT = list(range(3000, 3064))


def test_headers_reach_the_engine_and_the_router_key_does_not(tmp_path: Path) -> None:
    """Engines started with their own --api-key get --engine-api-key (health checks and
    /v1/models too, or they would never be live); trace context and vLLM's DP-rank header
    pass; the router's key stays in the router; one Date and one Server come back; the
    engine's model card (max_model_len) reaches /v1/models."""
    light = start_light(tmp_path, 1)
    light.fault(0, require_key="engine-key")
    router = start_router(
        tmp_path, [light.spec(0, "e0")], "--api-key", "router-key", "--engine-api-key",
        "engine-key", "--api-key-all",
    )  # fmt: skip
    try:

        def live() -> bool:
            try:
                r = httpx.get(
                    f"{router.url}/v1/proxy/workers",
                    headers={"authorization": "Bearer router-key"},
                    timeout=10,
                )
            except httpx.HTTPError:
                return False  # not listening yet
            return bool(r.json()["workers"][0]["live"])

        poll(live, "e0 live through its key")
        client = openai.OpenAI(
            base_url=f"{router.url}/v1", api_key="router-key", max_retries=0, timeout=30
        )
        raw = client.completions.with_raw_response.create(
            model=MODEL,
            prompt=PROMPT,
            max_tokens=1,
            extra_headers={
                "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
                "tracestate": "k=v",
                "X-data-parallel-rank": "1",
                "X-Custom": "kept",
                "x-kvroute-policy": "least_loaded",
            },
        )
        assert raw.headers.get_list("date") and len(raw.headers.get_list("date")) == 1
        assert raw.headers.get_list("server") == ["uvicorn"]
        seen = httpx.get(
            f"{light.url(0)}/last_request",
            headers={"authorization": "Bearer engine-key"},
            timeout=10,
        ).json()
        assert seen["authorization"] == "Bearer engine-key"
        assert seen["traceparent"].startswith("00-0af7")
        assert seen["tracestate"] == "k=v"
        assert seen["x-data-parallel-rank"] == "1"
        assert seen["x-custom"] == "kept"
        assert "x-kvroute-policy" not in seen
        assert "router-key" not in str(seen)
        (card,) = client.models.list().data
        assert card.id == MODEL and card.model_extra["max_model_len"] == 4096
    finally:
        stop(router.proc)
        stop(light.proc)


def test_a_broken_stream_ends_with_done_and_a_lone_worker_is_not_retried(
    tmp_path: Path,
) -> None:
    light = start_light(tmp_path, 1)
    router = start_router(tmp_path, [light.spec(0, "e0")])
    try:
        wait_live(router, ["e0"])
        light.fault(0, break_stream=True)
        body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 1, "stream": True}
        with httpx.stream("POST", f"{router.url}/v1/completions", json=body, timeout=30) as r:
            events = [line for line in r.iter_lines() if line.startswith("data:")]
        assert '"upstream_failed"' in events[-2], events  # the in-band error, then [DONE]
        assert events[-1] == "data: [DONE]", events
        light.fault(0, break_stream=False, completions_status=503)
        r = httpx.post(f"{router.url}/v1/completions", json={**body, "stream": False})
        assert r.status_code == 502
        # No other worker was left to take it: nothing was "retried away".
        assert router.workers()["e0"]["retried_away"] == 0
        assert router.workers()["e0"]["upstream_errors"] >= 1
    finally:
        stop(router.proc)
        stop(light.proc)


def test_multimodal_chat_and_prompt_embeds_are_forwarded_and_routed_on_load(
    tmp_path: Path,
) -> None:
    """vLLM takes image parts and prompt embeddings; the router cannot build the engine's
    token ids for them, so it routes on load and forwards the body unchanged (it answered
    400 before)."""
    light = start_light(tmp_path, 1)
    router = start_router(tmp_path, [light.spec(0, "e0")])
    try:
        wait_live(router, ["e0"])
        client = openai.OpenAI(base_url=f"{router.url}/v1", api_key="-", max_retries=0, timeout=30)
        image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
        chat = client.chat.completions.with_raw_response.create(
            model=MODEL,
            messages=[{"role": "user", "content": [{"type": "text", "text": "what?"}, image]}],
            max_tokens=1,
        )
        assert chat.headers["x-kvroute-worker"] == "e0"
        done = client.completions.with_raw_response.create(
            model=MODEL, prompt="", max_tokens=1, extra_body={"prompt_embeds": "AAAA"}
        )
        assert done.headers["x-kvroute-worker"] == "e0"
        assert "kvroute_proxy_untokenized_total 2.0" in router.metrics()
        # No model: the fleet serves one, so it is that one (vLLM's own default).
        r = httpx.post(f"{router.url}/v1/completions", json={"prompt": PROMPT}, timeout=30)
        assert r.status_code == 200 and r.headers["x-kvroute-worker"] == "e0"
        # A malformed part is still the client's mistake.
        with pytest.raises(openai.BadRequestError):
            client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": [{"text": "x"}]}], max_tokens=1
            )
    finally:
        stop(router.proc)
        stop(light.proc)


def test_embeddings_and_rerank_pass_through_with_the_clients_headers(tmp_path: Path) -> None:
    """vLLM serves them beside completions; through the router they reach a live engine
    serving the model (not a cache decision) with the client's headers, and need the
    router's key like completions."""
    light = start_light(tmp_path, 2)
    router = start_router(tmp_path, [light.spec(0, "e0"), light.spec(1, "e1")], "--api-key", "k")
    try:

        def live() -> bool:
            try:
                r = httpx.get(f"{router.url}/v1/proxy/workers", timeout=10)
            except httpx.HTTPError:
                return False
            return all(w["live"] for w in r.json()["workers"]) and len(r.json()["workers"]) == 2

        poll(live, "both light engines live")
        client = openai.OpenAI(base_url=f"{router.url}/v1", api_key="k", max_retries=0, timeout=30)
        raw = client.embeddings.with_raw_response.create(
            model=MODEL, input="kabe", encoding_format="float", extra_headers={"X-Trace": "t1"}
        )
        served = raw.headers["x-kvroute-worker"]
        assert raw.parse().data[0].embedding == [0.25, -0.5]
        i = ["e0", "e1"].index(served)
        seen = httpx.get(f"{light.url(i)}/last_request", timeout=10).json()
        assert seen["x-trace"] == "t1" and "authorization" not in seen  # the router's key stays
        for path in ("/v1/rerank", "/rerank"):
            body = {"model": MODEL, "query": "q", "documents": ["a", "b"]}
            r = httpx.post(f"{router.url}{path}", json=body, headers={"authorization": "Bearer k"})
            assert r.status_code == 200 and len(r.json()["results"]) == 2, r.text
            r = httpx.post(f"{router.url}{path}", json=body)
            assert r.status_code == 401 and r.json()["error"]["code"] == "unauthorized"
    finally:
        stop(router.proc)
        stop(light.proc)


def test_proxied_requests_outlive_the_route_ttl_and_warm_without_a_model(
    tmp_path: Path,
) -> None:
    """The TTL guards /v1/route callers that never finish; the proxy always finishes, so
    a generation longer than the TTL kept its load and was not counted as expired only
    by luck (it was). And a prompt long enough to be warmed, sent without `model`, was a
    500 (the warming request read body["model"])."""
    light = start_light(tmp_path, 1)
    env = {"KVROUTE_ROUTE_INFLIGHT_TTL_S": "1", "KVROUTE_ROUTE_PROFILE": "prefill-shaping"}
    router = start_router(tmp_path, [light.spec(0, "e0")], env=env)
    try:
        wait_live(router, ["e0"])
        light.fault(0, completions_delay_s=2.5)
        r = httpx.post(
            f"{router.url}/v1/completions",
            json={"model": MODEL, "prompt": PROMPT, "max_tokens": 1},
            timeout=30,
        )
        assert r.status_code == 200
        metrics = router.metrics()
        assert "kvroute_route_expired_total 0.0" in metrics
        assert "kvroute_route_finished_total 1.0" in metrics
        light.fault(0, completions_delay_s=0)
        long_prompt = list(range(10_000, 30_000))  # past warm_chunk: warmed first
        r = httpx.post(f"{router.url}/v1/completions", json={"prompt": long_prompt}, timeout=30)
        assert r.status_code == 200, r.text
        assert "kvroute_proxy_warm_requests_total 0.0" not in router.metrics()
    finally:
        stop(router.proc)
        stop(light.proc)
