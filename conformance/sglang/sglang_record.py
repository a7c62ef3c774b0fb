"""Drive SGLang's own RadixCache and publisher; record frames and match_prefix answers.

Runs inside ``.venv-sglang`` (``make conformance-sglang``); never imports kvroute. Per
scenario it builds ``RadixCache.create_simulated(page_size, enable_kv_cache_events=True)``,
serves multi-turn conversations (insert of prompt + output as a finished request does,
eviction under a token budget), hands every step's ``take_events()`` to SGLang's
``ZmqEventPublisher`` as the scheduler does, and before each step asks
``match_prefix`` (capped at ``len - 1`` tokens, as the scheduler's
``_compute_max_prefix_len``) about a set of probe prompts. The frames are read back from
the publisher's replay socket, i.e. exactly what a subscriber gets.

With ``--kvroute URL`` a running ``kvroute serve`` subscribes to the publisher too, and
every probe is also asked of its ``/v1/score`` (once the router has applied every batch
published so far); the run fails unless every answer equals ``match_prefix``'s.

Host tier: a second RadixCache of the same page size plays SGLang's host (L2) tier. It
takes write-through copies of every inserted sequence and evicts under its own budget;
its recorder reports with ``StorageMedium.CPU`` ("CPU_PINNED"), as HiCache's
``finish_write_through`` / host eviction do. A prefix hits on some tier up to
``max(device match, host match)`` (both trees are prefix-closed).
"""

from __future__ import annotations

import argparse
import functools
import json
import random
import sys
import time
import urllib.request
from array import array
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _sglang_env

_sglang_env.install_torchvision_placeholder()

import msgspec  # noqa: E402
import zmq  # noqa: E402
from sglang.srt.disaggregation.kv_events import (  # noqa: E402
    KVEventBatch,
    StorageMedium,
    ZmqEventPublisher,
)
from sglang.srt.mem_cache.base_prefix_cache import (  # noqa: E402
    EvictParams,
    InsertParams,
    MatchPrefixParams,
)
from sglang.srt.mem_cache.events import KvEventLoraNames  # noqa: E402
from sglang.srt.mem_cache.radix_cache import RadixCache, RadixKey  # noqa: E402

SCENARIOS: dict[str, dict[str, Any]] = {
    "page1": {"page_size": 1, "salts": [None], "loras": [None], "host": False, "seed": 1},
    "page16": {"page_size": 16, "salts": [None], "loras": [None], "host": False, "seed": 2},
    "salted": {
        "page_size": 4,
        "salts": [None, "tenant-a", "tenant-b"],
        "loras": [None, "adapter-x"],
        "host": False,
        "seed": 3,
    },
    "host": {
        "page_size": 16,
        "salts": [None, "tenant-a"],
        "loras": [None],
        "host": True,
        "seed": 4,
    },
}
LORA_IDS = {"adapter-x": "0123456789abcdef0123456789abcdef"}  # a LoRARef.lora_id (uuid hex)


class _Allocator:
    """The KV pool allocator RadixCache frees evicted slots into (no memory here)."""

    device = "cpu"

    def free_segment(self, *_args: Any, **_kwargs: Any) -> None:
        return None


def _key(tokens: list[int], ns: tuple[str | None, str | None], limit: int | None = None):
    salt, lora = ns
    extra_key = LORA_IDS[lora] if lora else None
    return RadixKey(array("q", tokens), extra_key=extra_key, cache_salt=salt, limit=limit)


def _match(cache: RadixCache, tokens: list[int], ns: tuple[str | None, str | None]) -> int:
    """What the scheduler reuses: match_prefix on the prompt capped at len - 1 tokens."""
    key = _key(tokens, ns, limit=max(len(tokens) - 1, 0))
    return cache.match_prefix(MatchPrefixParams(key=key)).device_prefix_len


class LiveRouter:
    """A running ``kvroute serve``, asked over plain HTTP (no kvroute import here)."""

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")
        self.exact = 0
        self.total = 0

    def _call(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method)
        req.add_header("content-type", "application/json")
        with urllib.request.urlopen(req, timeout=30) as resp:
            return json.loads(resp.read() or b"null")

    def register(self, worker_id: str, endpoint: str, replay_endpoint: str) -> None:
        body = {"worker_id": worker_id, "endpoint": endpoint, "replay_endpoint": replay_endpoint}
        self._call("POST", "/v1/workers", body)

    def wait_applied(self, worker_id: str, batches: int) -> None:
        deadline = time.monotonic() + 30
        while batches:
            seqs = self._call("GET", f"/v1/workers/{worker_id}").get("last_seq") or {}
            if max(seqs.values(), default=-1) >= batches - 1:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"kvroute did not apply {batches} batches: {seqs}")
            time.sleep(0.01)

    def check(self, worker_id: str, probe: dict[str, Any]) -> None:
        body = {
            "token_ids": probe["token_ids"],
            "cache_salt": probe["cache_salt"],
            "lora_name": probe["lora_name"],
            "workers": [worker_id],
        }
        w = self._call("POST", "/v1/score", body)["workers"][0]
        self.total += 1
        self.exact += (w["hit_tokens"], w["hit_tokens_gpu"]) == (
            probe["hit_tokens"],
            probe["hit_tokens_gpu"],
        )


class Scenario:
    def __init__(
        self, name: str, spec: dict[str, Any], port: int, live: LiveRouter | None = None
    ) -> None:
        self.name = name
        self.spec = spec
        self.page = spec["page_size"]
        self.rng = random.Random(spec["seed"])
        names = KvEventLoraNames()
        for lora, lora_id in LORA_IDS.items():
            names.register(SimpleNamespace(lora_id=lora_id, extra_key=lora_id), lora)
        self.device = RadixCache.create_simulated(
            mock_allocator=_Allocator(),
            page_size=self.page,
            enable_kv_cache_events=True,
            kv_event_lora_names=names,
        )
        self.host: RadixCache | None = None
        if spec["host"]:
            self.host = RadixCache.create_simulated(
                mock_allocator=_Allocator(),
                page_size=self.page,
                enable_kv_cache_events=True,
                kv_event_lora_names=names,
            )
            rec = self.host.kv_events
            rec.take()  # one engine, one reset: the device tree reported it
            rec.record_store = functools.partial(rec.record_store, medium=StorageMedium.CPU)  # type: ignore[method-assign]
            rec.record_remove = functools.partial(rec.record_remove, medium=StorageMedium.CPU)  # type: ignore[method-assign]
        self.device_budget = 420 if spec["host"] else 700
        self.host_budget = 900
        self.endpoint = f"tcp://127.0.0.1:{port}"
        self.replay_endpoint = f"tcp://127.0.0.1:{port + 1}"
        self.publisher = ZmqEventPublisher(
            attn_dp_rank=0,
            endpoint=self.endpoint,
            replay_endpoint=self.replay_endpoint,
            bind=True,
        )
        self.published = 0
        self.probes: list[dict[str, Any]] = []
        self.live = live
        self.worker_id = f"sglang-{name}"
        if live is not None:
            live.register(self.worker_id, self.endpoint, self.replay_endpoint)

    def _tokens(self, n: int) -> list[int]:
        return [self.rng.randrange(1, 150_000) for _ in range(n)]

    def publish_step(self) -> None:
        """The scheduler's publish_kv_events: one batch of everything recorded."""
        events = self.device.take_events()
        if self.host is not None:
            events += self.host.take_events()
        if events:
            self.publisher.publish(KVEventBatch(ts=time.time(), events=events))
            self.published += 1

    def probe(self, tokens: list[int], ns: tuple[str | None, str | None]) -> None:
        gpu = _match(self.device, tokens, ns)
        any_tier = max(gpu, _match(self.host, tokens, ns)) if self.host is not None else gpu
        probe = {
            "after_batches": self.published,
            "token_ids": tokens,
            "cache_salt": ns[0],
            "lora_name": ns[1],
            "hit_tokens": any_tier,
            "hit_tokens_gpu": gpu,
        }
        self.probes.append(probe)
        if self.live is not None:
            self.live.wait_applied(self.worker_id, self.published)
            self.live.check(self.worker_id, probe)

    def insert(self, tokens: list[int], ns: tuple[str | None, str | None]) -> None:
        for cache, budget in ((self.device, self.device_budget), (self.host, self.host_budget)):
            if cache is None:
                continue
            cache.insert(InsertParams(key=_key(tokens, ns).page_aligned(self.page)))
            excess = cache.evictable_size() - budget
            if excess > 0:
                cache.evict(EvictParams(num_tokens=excess))

    def run(self, turns: int = 36) -> None:
        self.publish_step()  # [AllBlocksCleared] from reset()
        system = self._tokens(40)
        namespaces = [(s, lo) for s in self.spec["salts"] for lo in self.spec["loras"]]
        convs = []
        for i in range(6):
            ns = namespaces[i % len(namespaces)]
            convs.append({"ns": ns, "history": system + self._tokens(self.rng.randint(5, 40))})
        for _ in range(turns):
            conv = self.rng.choice(convs)
            prompt = conv["history"] + self._tokens(self.rng.randint(3, 30))
            # Probes against the cache as it is now, then the request runs.
            self.probe(prompt, conv["ns"])
            for other in self.rng.sample(convs, 2):
                self.probe(other["history"] + self._tokens(5), other["ns"])
                if len(namespaces) > 1:  # the same tokens from another tenant
                    wrong = self.rng.choice([n for n in namespaces if n != other["ns"]])
                    self.probe(other["history"] + self._tokens(5), wrong)
            self.probe(conv["history"], conv["ns"])  # a cached sequence: the last-token cap
            self.probe(self._tokens(self.rng.randint(1, 40)), conv["ns"])
            output = self._tokens(self.rng.randint(5, 30))
            conv["history"] = prompt + output
            self.insert(conv["history"], conv["ns"])
            self.publish_step()
            if self.rng.random() < 0.15:  # a new conversation replaces one
                convs[self.rng.randrange(len(convs))] = {
                    "ns": self.rng.choice(namespaces),
                    "history": system + self._tokens(self.rng.randint(5, 40)),
                }

    def frames(self) -> list[list[bytes]]:
        """Every published batch, as the replay socket answers from seq 0."""
        ctx = zmq.Context.instance()
        sock = ctx.socket(zmq.DEALER)
        sock.connect(self.replay_endpoint)
        deadline = time.monotonic() + 30
        while self.publisher._event_queue.qsize() and time.monotonic() < deadline:
            time.sleep(0.05)  # the publisher thread drains its queue
        time.sleep(0.2)
        sock.send_multipart([b"", (0).to_bytes(8, "big")])
        out: list[list[bytes]] = []
        while True:
            if not sock.poll(10_000):
                raise RuntimeError("replay socket did not answer")
            _, topic, seq, payload = sock.recv_multipart()
            if seq == ZmqEventPublisher.END_SEQ:
                break
            out.append([topic, seq, payload])
        sock.close(linger=0)
        if len(out) != self.published:
            raise RuntimeError(f"replayed {len(out)} of {self.published} batches")
        return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--port", type=int, default=25557)
    ap.add_argument("--kvroute", help="base URL of a running kvroute serve to check live")
    args = ap.parse_args()
    live = LiveRouter(args.kvroute) if args.kvroute else None
    args.out.mkdir(parents=True, exist_ok=True)
    import sglang

    summary = {}
    for i, (name, spec) in enumerate(SCENARIOS.items()):
        if live is not None:
            live.exact = live.total = 0
        sc = Scenario(name, spec, args.port + 2 * i, live)
        sc.run()
        frames = sc.frames()
        sc.publisher.shutdown()
        record = {
            "scenario": name,
            "sglang_version": sglang.__version__,
            "page_size": sc.page,
            "frames": frames,
            "probes": sc.probes,
        }
        (args.out / f"{name}.msgpack").write_bytes(msgspec.msgpack.encode(record))
        hits = sum(1 for p in sc.probes if p["hit_tokens"] > 0)
        summary[name] = {"batches": len(frames), "probes": len(sc.probes), "probes_hit": hits}
        if live is not None:
            summary[name]["kvroute_exact"] = f"{live.exact}/{live.total}"
    print(json.dumps(summary, indent=1))
    if live is not None and any(
        v["kvroute_exact"] != f"{v['probes']}/{v['probes']}" for v in summary.values()
    ):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
