"""The live side of ``make conformance``: relay vLLM's frames to a real ``kvroute serve``
and ask its ``/v1/score`` at every probe (runs in .venv-vllm; HTTP only, stdlib only).

Why a relay: vLLM's ``ZmqEventPublisher`` binds only for ``*``/``::``/ipc/inproc and
adds the DP rank only to tcp/inproc ports, so a loopback-only, multi-rank setup needs its
inproc PUB (in this process) plus a hop. The relay forwards each frame's bytes unchanged
to an XPUB bound on 127.0.0.1 (one port per rank) that kvroute's SUB connects to; the
XPUB lets us wait for kvroute's subscription before the first frame.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from typing import Any

import zmq

WAIT_S = 30.0
REJECT_METRICS = (
    "kvroute_ingest_bad_events",
    "kvroute_ingest_unknown_parent",
    "kvroute_ingest_partial_unknown_prefix",
    "kvroute_ingest_unresolved_blocks",
    "kvroute_ingest_bad_groups",
    "kvroute_unknown_events",
    "kvroute_unknown_fields",
    "kvroute_legacy_events",
    "kvroute_malformed_events",
    "kvroute_decode_errors",
    "kvroute_gaps",
    "kvroute_ingest_errors",
)


class Router:
    """A running kvroute, over its REST API."""

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")
        spec = self._call("GET", "/openapi.json")
        schemas = spec.get("components", {}).get("schemas", {})
        self.worker_fields = set(schemas.get("WorkerCreate", {}).get("properties", {}))
        # The score route documents its body inline (it decodes with msgspec), older
        # versions as a component.
        body = (
            spec.get("paths", {})
            .get("/v1/score", {})
            .get("post", {})
            .get("requestBody", {})
            .get("content", {})
            .get("application/json", {})
            .get("schema", {})
        )
        self.score_fields = set(body.get("properties", {})) | set(
            schemas.get("ScoreRequest", {}).get("properties", {})
        )

    def _call(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method)
        req.add_header("content-type", "application/json")
        with urllib.request.urlopen(req, timeout=WAIT_S) as resp:
            raw = resp.read()
        return json.loads(raw) if path != "/metrics" else raw.decode()

    def register(self, worker_id: str, endpoint: str, settings: dict[str, Any]) -> None:
        """Register; engine settings go only where this kvroute's API has the field."""
        body = {"worker_id": worker_id, "endpoint": endpoint}
        body.update({k: v for k, v in settings.items() if k in self.worker_fields})
        self._call("POST", "/v1/workers", body)

    def wait_applied(self, worker_id: str, rank: int, seq: int) -> None:
        """Until the worker's index has taken batch ``seq`` of ``rank``."""
        deadline = time.monotonic() + WAIT_S
        while True:
            info = self._call("GET", f"/v1/workers/{worker_id}")
            if info.get("last_seq", {}).get(str(rank), -1) >= seq:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"{worker_id}: batch {seq} never applied ({info})")
            time.sleep(0.002)

    def hit_tokens(self, worker_id: str, probe: dict[str, Any]) -> int:
        body: dict[str, Any] = {
            "token_ids": probe["token_ids"],
            "workers": [worker_id],
            "lora_name": probe["lora_name"],
            "cache_salt": probe["cache_salt"],
        }
        if "skip_prefix_cache" in self.score_fields:
            body["skip_prefix_cache"] = probe["skip_prefix_cache"]
        rows = self._call("POST", "/v1/score", body)["workers"]
        return int(rows[0]["hit_tokens"]) if rows else 0

    def rejects(self) -> dict[str, float]:
        """Sum over labels of every reject counter in /metrics."""
        out: dict[str, float] = {}
        for line in self._call("GET", "/metrics").splitlines():
            if line.startswith("#") or not line.strip():
                continue
            name = line.split("{", 1)[0].split(" ", 1)[0]
            if name.endswith("_total"):
                name = name[: -len("_total")]
            if name in REJECT_METRICS:
                out[name] = out.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
        return out


class Relay:
    """XPUB sockets on 127.0.0.1, one per DP rank, fed with vLLM's frames unchanged."""

    def __init__(self, ranks: int) -> None:
        ctx = zmq.Context.instance()
        self.socks: list[zmq.Socket] = []
        self.endpoints: list[str] = []
        for _ in range(ranks):
            sock = ctx.socket(zmq.XPUB)
            sock.setsockopt(zmq.SNDHWM, 0)
            port = sock.bind_to_random_port("tcp://127.0.0.1")
            self.socks.append(sock)
            self.endpoints.append(f"tcp://127.0.0.1:{port}")

    def wait_subscribed(self) -> None:
        for sock in self.socks:
            if not sock.poll(int(WAIT_S * 1000)):
                raise TimeoutError("kvroute never subscribed")
            sock.recv()

    def send(self, rank: int, frames: list[bytes]) -> None:
        self.socks[rank].send_multipart(frames)

    def close(self) -> None:
        for sock in self.socks:
            sock.close(linger=1000)
