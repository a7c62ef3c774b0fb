"""1,000 malformed bodies to every endpoint over real HTTP: never a 5xx, always a clear
JSON 4xx, and the router keeps serving (memory bounded by the body limit)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from _helpers import serve_app

from router.config import RouterSettings
from router.http import create_app

ENDPOINTS = [
    ("POST", "/v1/score"),
    ("POST", "/v1/route"),
    ("POST", "/v1/workers"),
    ("POST", "/v1/requests/r1/finish"),
    ("POST", "/v1/completions"),
    ("POST", "/v1/chat/completions"),
    ("POST", "/tokenize"),
]


def bodies(rng: random.Random, n: int) -> list[bytes]:
    values: list[object] = [
        None, True, -1, 2**70, -(2**70), 1.5, "", "x" * 300, [], {}, [1, "a"], {"a": [1]},
    ]  # fmt: skip
    keys = [
        "token_ids", "workers", "lora_name", "cache_salt", "worker_id", "endpoint",
        "replay_endpoint", "topic", "model", "prompt", "messages", "request_id", "policy",
        "skip_prefix_cache", "hash_block_size", "eagle", "stream", "n", "max_tokens",
    ]  # fmt: skip
    out = []
    for _ in range(n):
        kind = rng.random()
        if kind < 0.2:
            out.append(rng.randbytes(rng.randint(0, 64)))
        elif kind < 0.3:
            out.append(b'{"token_ids": [1, 2' + rng.randbytes(3))  # truncated JSON
        else:
            body = {rng.choice(keys): rng.choice(values) for _ in range(rng.randint(0, 5))}
            if rng.random() < 0.3:
                body["token_ids"] = [rng.choice([-5, 0, 7, 2**64, "t", None]) for _ in range(4)]
            out.append(json.dumps(body).encode())
    return out


@pytest.mark.timeout(300)
async def test_no_body_makes_a_5xx() -> None:
    rng = random.Random(3)
    app = create_app(settings=RouterSettings())
    async with serve_app(app) as client:
        rss_before = _rss_mb()
        statuses: dict[int, int] = {}
        for method, path in ENDPOINTS:
            for body in bodies(rng, 1000):
                r = await client.request(
                    method, path, content=body, headers={"content-type": "application/json"}
                )
                assert r.status_code < 500, (path, body[:80], r.status_code, r.text[:200])
                statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
                if r.status_code >= 400:
                    err = r.json()
                    assert set(err) == {"error"} and err["error"]["code"], (path, r.text[:200])
        assert (await client.get("/healthz")).status_code == 200
        grew = _rss_mb() - rss_before
        print(
            f"\n{sum(statuses.values())} malformed bodies: {sorted(statuses.items())}; "
            f"RSS +{grew:.0f} MB"
        )
        assert grew < 100  # bounded: nothing a rejected body carried is kept


def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")
