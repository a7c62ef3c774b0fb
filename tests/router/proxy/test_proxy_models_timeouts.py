"""Issue 16's remaining proxy promises with real processes and the official ``openai``
client: several models behind one router, each request routed only to the workers
serving its ``model``; the forward timeout and the retry count as configured."""

from __future__ import annotations

from pathlib import Path

import httpx
import openai
import pytest
from _fleet import (
    MODEL,
    poll,
    shutdown,
    start_engines,
    start_light,
    start_router,
    stop,
    wait_live,
)

pytestmark = pytest.mark.timeout(300)

PROMPT = list(range(2000, 2064))  # four 16-token blocks
LONGEST = {"x-kvroute-policy": "longest_prefix"}  # pure cache order: the test is exact


def test_requests_route_by_model_to_the_workers_serving_it(tmp_path: Path) -> None:
    alpha = start_engines(tmp_path, 1, "--served-model-name", "alpha", prefix="alpha")[0]
    beta = start_engines(tmp_path, 1, "--served-model-name", "beta", prefix="beta")[0]
    # alpha named in the worker spec, beta discovered from the engine's /v1/models.
    router = start_router(tmp_path, [alpha.spec() + ",model=alpha", beta.spec()])
    router.engines = [alpha, beta]
    try:
        wait_live(router, [alpha.worker_id, beta.worker_id])
        poll(lambda: router.workers()[beta.worker_id]["models"] == ["beta"], "beta discovered")
        client = openai.OpenAI(base_url=f"{router.url}/v1", api_key="-", max_retries=0, timeout=30)
        assert [m.id for m in client.models.list()] == ["alpha", "beta"]
        for i in range(4):
            for model, engine in (("alpha", alpha), ("beta", beta)):
                raw = client.completions.with_raw_response.create(
                    model=model, prompt=f"kabe dodo {i} " * 8, max_tokens=1
                )
                assert raw.headers["x-kvroute-worker"] == engine.worker_id
                assert raw.parse().model == model
        chat = client.chat.completions.with_raw_response.create(
            model="beta", messages=[{"role": "user", "content": "mopa"}], max_tokens=2
        )
        assert chat.headers["x-kvroute-worker"] == beta.worker_id
        r = httpx.post(f"{router.url}/tokenize", json={"model": "alpha", "prompt": "kabe"})
        assert r.status_code == 200 and r.headers["x-kvroute-worker"] == alpha.worker_id
        # A model nobody serves: a clear 404 that names what is served.
        with pytest.raises(openai.NotFoundError) as err:
            client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=1
            )
        assert err.value.body["code"] == "model_not_found"
        assert "alpha" in err.value.body["message"] and "beta" in err.value.body["message"]
        # No model at all: vLLM would serve its one model; two are served here.
        r = httpx.post(f"{router.url}/v1/completions", json={"prompt": "kabe"}, timeout=30)
        assert r.status_code == 400 and "alpha, beta" in r.json()["error"]["message"]
        assert router.workers()[alpha.worker_id]["routed"] == 4
        assert router.workers()[beta.worker_id]["routed"] == 5
    finally:
        shutdown(router)


def hits(router_url: str) -> dict[str, int]:
    r = httpx.post(f"{router_url}/v1/score", json={"token_ids": PROMPT}, timeout=10)
    return {w["worker_id"]: w["hit_tokens"] for w in r.json()["workers"]}


def upstream_errors(router_workers: dict[str, dict]) -> int:
    return sum(w["upstream_errors"] for w in router_workers.values())


def test_forward_timeout_and_retry_count_are_configurable(tmp_path: Path) -> None:
    light = start_light(tmp_path, 3)
    names = ["slow", "x", "y"]
    router = start_router(
        tmp_path,
        [light.spec(i, name) for i, name in enumerate(names)],
        "--proxy-timeout-s", "0.5", "--proxy-retries", "1",
    )  # fmt: skip
    try:
        wait_live(router, names)
        # "slow" holds the prompt (longest_prefix sends it there first) and hangs.
        r = httpx.post(f"{light.url(0)}/v1/completions", json={"model": MODEL, "prompt": PROMPT})
        assert r.status_code == 200
        poll(lambda: hits(router.url)["slow"] == 48, "slow holds the prompt")
        light.fault(0, completions_delay_s=20)
        client = openai.OpenAI(base_url=f"{router.url}/v1", api_key="-", max_retries=0, timeout=30)
        raw = client.completions.with_raw_response.create(
            model=MODEL, prompt=PROMPT, max_tokens=1, extra_headers=LONGEST
        )
        # Timed out after 0.5 s of silence (not the 600 s default), retried elsewhere.
        assert raw.headers["x-kvroute-worker"] in {"x", "y"}
        slow = router.workers()["slow"]
        assert slow["routed"] == 1 and slow["retried_away"] == 1
        assert slow["forward_failures"] == 1  # out until its next good health check
        assert 'kvroute_proxy_retries_total{worker="slow"} 1.0' in router.metrics()

        # Every worker failing: 1 retry configured = exactly 2 attempts, then a JSON 502.
        light.fault(0, completions_delay_s=0)
        for i in range(3):
            light.fault(i, completions_status=503)
        poll(lambda: router.live() == set(names), "slow back after a good health check")
        before = upstream_errors(router.workers())
        r = httpx.post(
            f"{router.url}/v1/completions", json={"model": MODEL, "prompt": PROMPT}, timeout=30
        )
        assert r.status_code == 502 and r.json()["error"]["code"] == "upstream_failed"
        assert upstream_errors(router.workers()) - before == 2
    finally:
        shutdown(router)
        stop(light.proc)
