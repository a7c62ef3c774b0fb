"""Retry on a 5xx before the first byte onto the next-best worker, and "only live workers
are routed to" - with real processes: ``kvroute engine`` children, light engines (a real
HTTP server and a real KV event stream each, with a fault switch; benchmarks/
light_engines.py) and ``kvroute serve``, driven with the official ``openai`` client."""

from __future__ import annotations

from pathlib import Path

import httpx
import openai
import pytest
from _fleet import MODEL, poll, shutdown, start_engines, start_light, start_router, stop, wait_live

from router.netutil import free_ports

pytestmark = pytest.mark.timeout(300)

PROMPT = list(range(1000, 1064))  # four 16-token blocks
LONGEST = {"x-kvroute-policy": "longest_prefix"}  # pure cache order: the test is exact


def hits(router_url: str, tokens: list[int]) -> dict[str, int]:
    r = httpx.post(f"{router_url}/v1/score", json={"token_ids": tokens}, timeout=10)
    assert r.status_code == 200, r.text
    return {w["worker_id"]: w["hit_tokens"] for w in r.json()["workers"]}


def test_5xx_before_the_first_byte_is_retried_on_the_next_best_worker(tmp_path: Path) -> None:
    engines = start_engines(tmp_path, 2)
    light = start_light(tmp_path, 1)
    a, b = engines
    router = start_router(tmp_path, [a.spec(), b.spec(), light.spec(0, "bad")])
    router.engines = engines
    try:
        wait_live(router, [a.worker_id, b.worker_id, "bad"])
        # "bad" holds the whole prompt, a half of it, b nothing: bad, then a, is the order.
        light.fault(0, completions_status=503)
        r = httpx.post(
            f"{light.url(0)}/v1/completions", json={"model": MODEL, "prompt": PROMPT}, timeout=10
        )
        assert r.status_code == 503
        r = httpx.post(
            f"{a.url}/v1/completions",
            json={"model": MODEL, "prompt": PROMPT[:32], "max_tokens": 1},
            timeout=30,
        )
        assert r.status_code == 200
        want = {"bad": 48, a.worker_id: 32, b.worker_id: 0}  # a full prompt hits n-1 tokens
        poll(lambda: hits(router.url, PROMPT) == want, f"index holds {want}")

        client = openai.OpenAI(base_url=f"{router.url}/v1", api_key="-", max_retries=0, timeout=30)
        raw = client.completions.with_raw_response.create(
            model=MODEL, prompt=PROMPT, max_tokens=2, extra_headers=LONGEST
        )
        assert raw.headers["x-kvroute-worker"] == a.worker_id
        assert raw.headers["x-kvroute-hit-tokens"] == "32"
        completion = raw.parse()
        assert completion.usage is not None and completion.usage.prompt_tokens == 64
        details = completion.usage.prompt_tokens_details
        assert details is not None and details.cached_tokens == 32  # a's own word

        # GET /v1/workers: routed, estimated vs engine-reported cached tokens, accuracy.
        view = httpx.get(f"{router.url}/v1/workers/{a.worker_id}", timeout=10).json()["proxy"]
        assert view["routed"] == 1 and view["estimated_hit_tokens"] == 32
        assert view["cached_tokens"] == 32 and view["estimate_exact_share"] == 1.0
        bad = router.workers()["bad"]
        assert bad["routed"] == 1 and bad["upstream_errors"] == 1 and bad["retried_away"] == 1
        assert bad["live"]  # an answering worker that said 5xx is not taken out
        metrics = router.metrics()
        assert 'kvroute_proxy_retries_total{worker="bad"} 1.0' in metrics
        assert 'kvroute_proxy_upstream_errors_total{worker="bad"} 1.0' in metrics
        poll(  # the same on the dashboard (its summary is recomputed once a period)
            lambda: (
                (w := router.dashboard()["workers"])["bad"]["retried_away"] == 1
                and w["bad"]["upstream_errors"] == 1
                and w[a.worker_id]["cached_tokens"] == 32
            ),
            "the dashboard shows the retry",
        )

        # With every candidate failing: a JSON 502 naming the last failure, no hang.
        stop(a.proc, kill=True)
        stop(b.proc, kill=True)
        poll(lambda: router.live() == {"bad"}, "only bad left")
        r = httpx.post(
            f"{router.url}/v1/completions", json={"model": MODEL, "prompt": PROMPT}, timeout=30
        )
        assert r.status_code == 502 and r.json()["error"]["code"] == "upstream_failed"
        assert "HTTP 503" in r.json()["error"]["message"]
        poll(
            lambda: router.dashboard()["outcomes"].get("upstream_failed") == 1,
            "the dashboard counts the failed request",
        )
    finally:
        shutdown(router)
        stop(light.proc)


def test_only_live_workers_get_traffic_and_v1_workers_says_why(tmp_path: Path) -> None:
    light = start_light(tmp_path, 4)
    closed_http, ghost_pub, ghost_replay, ghost_http = free_ports(4)
    specs = [
        light.spec(0, "http-down").rsplit(",http=", 1)[0] + f",http=http://127.0.0.1:{closed_http}",
        light.spec(1, "events-down"),
        light.spec(2, "health-500"),
        light.spec(3, "ok"),
        f"ghost=tcp://127.0.0.1:{ghost_pub},replay=tcp://127.0.0.1:{ghost_replay},"
        f"http=http://127.0.0.1:{ghost_http}",
    ]
    router = start_router(tmp_path, specs)
    try:
        wait_live(router, ["events-down", "health-500", "ok"])
        # The workers about to go down hold the prompt: a cache-only router would pick them.
        for i in (0, 1, 2):
            httpx.post(
                f"{light.url(i)}/v1/completions",
                json={"model": MODEL, "prompt": PROMPT},
                timeout=10,
            ).raise_for_status()
        poll(
            lambda: all(hits(router.url, PROMPT)[w] == 48 for w in ("events-down", "health-500")),
            "index holds the prompt on the doomed workers",
        )
        light.fault(1, close_events=True)
        light.fault(2, health_status=500)
        poll(lambda: router.live() == {"ok"}, "only ok live")

        client = openai.OpenAI(base_url=f"{router.url}/v1", api_key="-", max_retries=0, timeout=30)
        for i in range(12):
            raw = client.completions.with_raw_response.create(
                model=MODEL,
                prompt=PROMPT if i % 2 else PROMPT[: 16 + i],
                max_tokens=1,
                extra_headers=LONGEST if i % 3 else None,
            )
            assert raw.headers["x-kvroute-worker"] == "ok"

        listed = httpx.get(f"{router.url}/v1/workers", timeout=10).json()["workers"]
        why = {w["worker_id"]: w["proxy"]["why_not_live"] for w in listed}
        routed = {w["worker_id"]: w["proxy"]["routed"] for w in listed}
        assert why["ok"] is None and routed["ok"] == 12
        assert all(routed[w] == 0 for w in why if w != "ok")
        assert "never connected" in why["ghost"]
        assert "GET /health failed" in why["http-down"]
        assert "disconnected" in why["events-down"]
        assert "answered 500" in why["health-500"]
        one = httpx.get(f"{router.url}/v1/workers/health-500", timeout=10).json()
        assert one["proxy"]["live"] is False and one["proxy"]["http_ok"] is False
    finally:
        shutdown(router)
        stop(light.proc)
