"""``/v1/stream`` on the real router: the dashboard summary fed by a real ZMQ publisher,
a Redis outage, the API key, the metrics documentation, and the structured-log set-up."""

from __future__ import annotations

import io
import json
import logging
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from _helpers import read_n, serve_app, sse_events, wait_until

from publisher.zmq_publisher import ZmqEventPublisher
from router.config import RouterSettings
from router.http import create_app
from router.http.hub import StreamHub
from router.logging_setup import configure_logging, event_extra
from schemas import BlockRemoved, BlockStored, KVEventBatch


def _stored(hashes: list[int], group: int, kind: str, medium: str = "GPU", **kw: Any) -> Any:
    # Offloaded copies carry no tokens (the router resolves them by engine hash).
    first = hashes[0]
    tokens = [] if medium != "GPU" else list(range(first, first + len(hashes) * 4))
    return BlockStored(
        block_hashes=hashes,
        parent_block_hash=None,
        token_ids=tokens,
        block_size=4,
        lora_id=None,
        medium=medium,
        lora_name=None,
        group_idx=group,
        kv_cache_spec_kind=kind,
        **kw,
    )


@pytest.fixture
def publisher() -> Any:
    pub = ZmqEventPublisher("tcp://127.0.0.1:*", replay_endpoint="tcp://127.0.0.1:*", topic="kv")
    yield pub
    pub.shutdown()


@pytest.fixture
def json_logs() -> Any:
    buf = io.StringIO()
    root = logging.getLogger()
    level = root.level
    handler = configure_logging(json=True, level="info", stream=buf)
    yield buf
    root.removeHandler(handler)
    root.setLevel(level)


async def test_router_stream_summary_dashboard_and_logs(publisher: Any, json_logs: io.StringIO):
    app = create_app(settings=RouterSettings(replay_timeout_s=1.0))
    hub: StreamHub = app.state.stream_hub
    hub.period_s = 0.1
    service = app.state.service
    async with serve_app(app) as client:
        page = await client.get("/")
        assert page.status_code == 200 and 'id="blocks-chart"' in page.text
        js = await client.get("/static/app.js")
        assert js.status_code == 200 and "javascript" in js.headers["content-type"]
        assert "EventSource" in js.text
        assert (await client.get("/static/style.css")).status_code == 200
        assert (await client.get("/static/nope.js")).status_code == 404

        spec = {
            "worker_id": "w0",
            "endpoint": publisher.bound_endpoint,
            "replay_endpoint": publisher.bound_replay_endpoint,
        }
        assert (await client.post("/v1/workers", json=spec)).status_code == 201
        await wait_until(
            lambda: service.subscriptions.get("w0").state == "connected", "w0 connected"
        )

        def publish_all() -> None:
            # 200 batches: two groups on GPU, offloaded copies on CPU, a removal each.
            for i in range(200):
                base = 1000 * (i + 1)
                events: list[Any] = [
                    _stored([base, base + 1, base + 2], 0, "full_attention"),
                    _stored(
                        [base, base + 1, base + 2],
                        1,
                        "sliding_window",
                        kv_cache_spec_sliding_window=8,
                    ),
                ]
                if i % 2 == 0:
                    events.append(_stored([base, base + 1], 0, "full_attention", medium="CPU"))
                events.append(BlockRemoved(block_hashes=[base], medium="GPU", group_idx=1))
                publisher.publish(KVEventBatch(ts=time.time(), events=events))
            service.recent_routes.append(
                {
                    "ts": time.time(),
                    "request_id": "req-1",
                    "worker_id": "w0",
                    "hit_tokens": 48,
                    "request_tokens": 64,
                    "policy": "kv_aware",
                }
            )

        final: dict[str, Any] = {}
        rates: list[float] = []
        async with client.stream("GET", "/v1/stream") as r:
            assert r.headers["cache-control"] == "no-cache"
            async for event, _id, data in sse_events(r):
                assert event == "summary"
                if not rates:  # the first summary precedes every block
                    assert data["workers"][0]["blocks_total"] == 0
                    publish_all()
                rates.append(data["totals"]["store_rate"])
                workers = data["workers"]
                if workers and workers[0]["last_seq"].get("0") == 199:
                    final = data
                    metrics = (await client.get("/metrics")).text  # while still listening
                    break
        w = final["workers"][0]
        assert w["worker_id"] == "w0" and w["state"] == "connected"
        groups = {g["group_idx"]: g for g in w["groups"]}
        assert groups[0]["kind"] == "full_attention" and groups[0]["block_size"] == 4
        assert groups[1]["kind"] == "sliding_window" and groups[1]["sliding_window"] == 8
        assert groups[0]["blocks"] == {"GPU": 600, "CPU": 200}
        assert groups[1]["blocks"] == {"GPU": 400}
        assert w["blocks"] == {"GPU": 1000, "CPU": 200} and w["blocks_total"] == 1200
        assert final["totals"]["blocks"] == {"GPU": 1000, "CPU": 200}
        assert final["totals"]["groups"] == {"0": {"GPU": 600, "CPU": 200}, "1": {"GPU": 400}}
        assert w["events"] == 200 * 3 + 100 and w["gaps"] == 0
        assert final["index"] == {
            "kind": "memory",
            "up": True,
            "entries": 1000,  # one entry per (worker, group, block) on any tiers
            "bytes": final["index"]["bytes"],
        }
        assert final["routes"] == [service.recent_routes[0]]
        assert max(rates) > 0  # blocks were stored between two ticks
        assert "kvroute_stream_clients 1.0" in metrics
        assert "kvroute_stream_summaries_total" in metrics

        await wait_until(lambda: hub.clients == 0, "stream client gone")
        assert (await client.delete("/v1/workers/w0")).status_code == 204

    # Structured logs: JSON lines for lifecycle events only - not one per batch or block.
    lines = [json.loads(line) for line in json_logs.getvalue().splitlines()]
    assert lines and all({"ts", "level", "logger", "msg"} <= set(r) for r in lines)
    assert any("w0" in r["msg"] and "registered" in r["msg"] for r in lines)
    assert len(lines) < 30, [r["msg"] for r in lines]


async def test_stream_keeps_flowing_through_a_redis_outage(
    publisher: Any, redis_factory: Callable[[], Any]
):
    """With the Redis index: blocks are counted from Redis; when Redis dies the summary
    says the index is down and the stream goes on (no crash, no stuck client)."""
    redis = redis_factory()
    app = create_app(settings=RouterSettings(index="redis", redis_url=redis.url))
    hub: StreamHub = app.state.stream_hub
    hub.period_s = 0.1
    service = app.state.service
    spec = {"worker_id": "w0", "endpoint": publisher.bound_endpoint}
    async with serve_app(app) as client:
        assert (await client.post("/v1/workers", json=spec)).status_code == 201
        await wait_until(lambda: service.subscriptions.get("w0").state == "connected", "w0")
        publisher.publish(
            KVEventBatch(ts=time.time(), events=[_stored([7, 8, 9], 0, "full_attention")])
        )
        seen_up = seen_down = False
        async with client.stream("GET", "/v1/stream") as r:
            async for _event, _id, data in sse_events(r):
                if not seen_up:
                    if data["workers"] and data["workers"][0]["blocks"] == {"GPU": 3}:
                        assert data["index"]["kind"] == "redis" and data["index"]["up"]
                        assert data["index"]["entries"] == 3
                        seen_up = True
                        redis.stop()
                elif not data["index"]["up"]:
                    assert data["workers"][0]["worker_id"] == "w0"
                    seen_down = True
                    break
        assert seen_up and seen_down
        assert (await client.get("/healthz")).status_code == 200


async def test_stream_honours_api_key_all():
    app = create_app(settings=RouterSettings(api_key="k", api_key_all=True))
    async with serve_app(app) as client:
        r = await client.get("/v1/stream")
        assert r.status_code == 401 and r.json()["error"]["code"] == "unauthorized"
        assert (await client.get("/")).status_code == 200  # the page itself is static
        got = await read_n(client, 1, "/v1/stream", headers={"X-API-Key": "k"})
        assert got[0][1]["totals"]["workers"] == 0


async def test_every_exported_metric_is_documented():
    """The one metrics table (docs/observability.md) lists every ``kvroute_*`` family
    /metrics exports, and nothing it lists is missing."""
    doc = (Path(__file__).resolve().parents[3] / "docs" / "observability.md").read_text()
    table = doc[doc.index("## Prometheus metrics") :]
    table = table[: table.index("\n## ", 1)]
    names = re.compile(r"`(kvroute_[a-z_]+)`")
    in_table = set(names.findall(table))
    app = create_app(settings=RouterSettings())
    async with serve_app(app) as client:
        text = (await client.get("/metrics")).text
    exported = {
        line.split()[2]
        for line in text.splitlines()
        if line.startswith("# TYPE kvroute_") and not line.split()[2].endswith("_created")
    }
    assert len(exported) > 30
    assert exported <= in_table, f"undocumented: {sorted(exported - in_table)}"
    stale = sorted(in_table - exported)
    assert not stale, f"documented, not exported: {stale}"


def test_text_and_json_log_formats():
    buf = io.StringIO()
    root = logging.getLogger()
    level = root.level
    log = logging.getLogger("router.test")
    try:
        configure_logging(json=False, level="debug", stream=buf)
        log.info("worker %s gap", "w1", extra=event_extra("worker_gap", worker="w1", first=3))
        handler = configure_logging(json=True, level="warning", stream=buf)
        assert sum(1 for h in root.handlers if h.get_name() == "kvroute") == 1
        log.info("not shown at warning level")
        log.warning("worker %s resync", "w1", extra=event_extra("worker_resync", worker="w1"))
        logging.getLogger("uvicorn.error").warning("uvicorn speaks JSON too")
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
    text, *json_lines = buf.getvalue().splitlines()
    assert "worker w1 gap" in text and "event=worker_gap" in text and "first=3" in text
    records = [json.loads(line) for line in json_lines]
    assert [r["msg"] for r in records] == ["worker w1 resync", "uvicorn speaks JSON too"]
    assert records[0]["event"] == "worker_resync" and records[0]["worker"] == "w1"
    assert records[0]["level"] == "warning" and records[1]["logger"] == "uvicorn.error"
    with pytest.raises(ValueError):
        configure_logging(level="loud")
