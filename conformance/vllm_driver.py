"""Record vLLM 0.33's own events and answers, or check a live kvroute (runs in .venv-vllm).

Why: kvroute's score must equal what vLLM itself would reuse. ``vllm_engine.RankEngine``
drives vLLM's real ``KVCacheManager``; each step's ``take_events()`` is published through
vLLM's own ``ZmqEventPublisher`` and the frames are received by real SUB sockets. At
each request's arrival, vLLM's lookup is a *probe* (tokens asked, hit tokens answered).

Modes: record (default) writes one msgpack recording per scenario (format in
``tests/fixtures/vllm-conformance/README.md``); ``--live URL`` relays the frames to a
running ``kvroute serve`` and asks its ``/v1/score`` at every probe (``live_client``),
printing one JSON line per scenario. It never imports kvroute.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import time
from collections.abc import Callable
from typing import Any

import msgspec
import zmq
from vllm.distributed.kv_events import ZmqEventPublisher
from vllm.utils.hashing import get_hash_fn_by_name
from vllm.v1.core.kv_cache_utils import init_none_hash

from conformance.vllm_engine import RankEngine, worker_info
from conformance.workload import Scenario, actions

VLLM_VERSION = "0.33.0"
MAX_DRAIN_STEPS = 20_000


_SINK_IDS = itertools.count()


class FrameSink:
    """Real SUB sockets, one per DP rank, connected to vLLM's bound PUBs.

    vLLM binds its PUB for inproc:// endpoints (suffix ``_dp<rank>`` for rank > 0; ipc://
    has no DP offset and tcp://* would bind every interface); the publisher uses
    ``zmq.Context.instance()``, so this process's SUBs reach it."""

    def __init__(self, ranks: int) -> None:
        self.endpoint = f"inproc://kvroute-conformance-{next(_SINK_IDS)}"
        self.ctx = zmq.Context.instance()
        self.subs: list[zmq.Socket] = []
        for r in range(ranks):
            sub = self.ctx.socket(zmq.SUB)
            sub.setsockopt(zmq.SUBSCRIBE, b"")
            sub.setsockopt(zmq.RCVHWM, 0)
            sub.connect(self.endpoint if r == 0 else f"{self.endpoint}_dp{r}")
            self.subs.append(sub)

    def wait_peers(self) -> None:
        # inproc connects before the bind and attaches when vLLM binds; the PUB takes
        # the subscription on its next command pass. Seqs are checked from 0, so a
        # lost first frame fails the recording instead of going unnoticed.
        time.sleep(0.05)

    def recv(self, rank: int, timeout_s: float = 10.0) -> list[bytes]:
        sub = self.subs[rank]
        if not sub.poll(int(timeout_s * 1000)):
            raise TimeoutError("a published batch never arrived")
        return sub.recv_multipart()

    def close(self) -> None:
        for sub in self.subs:
            sub.close(linger=0)


def run(
    sc: Scenario,
    endpoint: str,
    on_step: Callable[[dict[str, Any]], None],
    after_publish: Callable[[int], None],
    replay_endpoint: str | None = None,
    deterministic_ts: bool = True,
    on_ready: Callable[[], None] | None = None,
) -> None:
    """Run the scenario's actions; ``on_step`` gets actions and probes in time order,
    ``after_publish(rank)`` runs after each published batch (to collect its frame)."""
    from vllm.v1.core import kv_cache_utils

    hash_fn = get_hash_fn_by_name(sc.hash_algo)
    init_none_hash(hash_fn)
    assert kv_cache_utils.NONE_HASH is not None
    clock = [0]

    def ts() -> float:
        clock[0] += 1
        return 1_700_000_000.0 + clock[0] / 100 if deterministic_ts else time.time()

    pubs = [
        ZmqEventPublisher(data_parallel_rank=r, endpoint=endpoint, replay_endpoint=replay_endpoint)
        for r in range(sc.dp_ranks)
    ]
    try:
        if on_ready is not None:
            on_ready()
        engines = [RankEngine(sc, r, pubs[r], ts) for r in range(sc.dp_ranks)]
        by_id: dict[str, RankEngine] = {}
        pending = [0] * sc.dp_ranks

        def publish_hook(rank: int) -> Callable[[], None]:
            def done() -> None:
                pending[rank] += 1
                after_publish(rank)

            return done

        def do_step() -> None:
            for eng in engines:
                before = clock[0]
                eng.step(on_step)
                if clock[0] != before:
                    publish_hook(eng.rank)()

        for a in actions(sc):
            if a["op"] == "drain":
                on_step(a)
                for _ in range(MAX_DRAIN_STEPS):
                    if not any(e.busy for e in engines):
                        break
                    do_step()
                else:
                    raise RuntimeError("drain did not finish")
                continue
            on_step(a)
            if a["op"] == "add":
                eng = engines[a["dp_rank"]]
                by_id[a["request_id"]] = eng
                eng.add(a, on_step)
            elif a["op"] == "abort":
                by_id[a["request_id"]].abort(a["request_id"])
            elif a["op"] == "step":
                do_step()
    finally:
        for p in pubs:
            p.shutdown()


def record(sc: Scenario) -> dict[str, Any]:
    """Run ``sc`` and return its recording (frames captured on a real SUB socket)."""
    sink = FrameSink(sc.dp_ranks)
    steps: list[dict[str, Any]] = []
    expect_seq = [0] * sc.dp_ranks

    def on_step(item: dict[str, Any]) -> None:
        steps.append(item if item["op"] in ("probe", "admit") else {"op": "action", "action": item})

    def after_publish(rank: int) -> None:
        topic, seq_b, payload = sink.recv(rank)
        seq = int.from_bytes(seq_b, "big")
        batch = msgspec.msgpack.decode(payload)
        got_rank = batch[2] if len(batch) > 2 else 0
        if got_rank != rank or seq != expect_seq[rank]:
            raise RuntimeError(f"frame out of order: rank {got_rank} seq {seq}")
        expect_seq[rank] += 1
        steps.append(
            {"op": "frame", "dp_rank": rank, "topic": topic, "seq": seq, "payload": payload}
        )

    try:
        run(
            sc,
            sink.endpoint,
            on_step,
            after_publish,
            on_ready=sink.wait_peers,
        )
    finally:
        sink.close()
    return {
        "format": 1,
        "vllm_version": VLLM_VERSION,
        "scenario": sc.name,
        "description": sc.description,
        "worker": worker_info(sc),
        "groups": [
            {"kind": g.kind, "block_size": g.block_size, "sliding_window": g.sliding_window}
            for g in sc.groups
        ],
        "steps": steps,
    }


def live(sc: Scenario, router_url: str) -> dict[str, Any]:
    """Run ``sc`` against a running kvroute: frames relayed to it, probes asked over HTTP."""
    from conformance.live_client import Relay, Router

    router = Router(router_url)
    sink = FrameSink(sc.dp_ranks)
    relay = Relay(sc.dp_ranks)
    settings = worker_info(sc)
    # What the operator knows and registers: whether clients ask for full reports.
    settings["report_full"] = sc.report_full_rate > 0
    wids = [f"{sc.name}-dp{r}" for r in range(sc.dp_ranks)]
    for r, wid in enumerate(wids):
        router.register(wid, relay.endpoints[r], settings)
    relay.wait_subscribed()
    before = router.rejects()
    published = [-1] * sc.dp_ranks
    res: dict[str, Any] = {
        "scenario": sc.name,
        "exact": 0,
        "total": 0,
        "over": 0,
        "under": 0,
        "mismatches": [],
    }

    def on_step(item: dict[str, Any]) -> None:
        if item["op"] != "probe":
            return
        r = item["dp_rank"]
        if published[r] >= 0:
            router.wait_applied(wids[r], r, published[r])
        got = router.hit_tokens(wids[r], item)
        want = item["expected_hit_tokens"]
        res["total"] += 1
        res["exact"] += got == want
        res["over"] += got > want
        res["under"] += got < want
        if got != want and len(res["mismatches"]) < 8:
            res["mismatches"].append(
                f"probe {res['total']} ({item['request_id']}, rank {r}): vLLM {want}, kvroute {got}"
            )

    def after_publish(rank: int) -> None:
        frames = sink.recv(rank)
        relay.send(rank, frames)
        published[rank] = int.from_bytes(frames[1], "big")

    try:
        run(sc, sink.endpoint, on_step, after_publish, on_ready=sink.wait_peers)
        for r, wid in enumerate(wids):
            if published[r] >= 0:
                router.wait_applied(wid, r, published[r])
        after = router.rejects()
        res["rejects"] = {
            k: int(v - before.get(k, 0)) for k, v in after.items() if v != before.get(k, 0)
        }
    finally:
        relay.close()
        sink.close()
    return res


def main(argv: list[str] | None = None) -> int:
    from conformance.scenarios import BY_NAME, SCENARIOS

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="tests/fixtures/vllm-conformance")
    ap.add_argument("--scenario", action="append", help="default: all")
    ap.add_argument("--live", metavar="URL", help="check a running kvroute instead")
    args = ap.parse_args(argv)
    chosen = [BY_NAME[n] for n in args.scenario] if args.scenario else list(SCENARIOS)
    if args.live:
        for sc in chosen:
            print(json.dumps(live(sc, args.live)), flush=True)
        return 0
    os.makedirs(args.out, exist_ok=True)
    for sc in chosen:
        t0 = time.perf_counter()
        rec = record(sc)
        data = msgspec.msgpack.encode(rec)
        path = os.path.join(args.out, f"{sc.name}.msgpack")
        with open(path, "wb") as f:
            f.write(data)
        probes = [s for s in rec["steps"] if s["op"] == "probe"]
        frames = [s for s in rec["steps"] if s["op"] == "frame"]
        hits = sum(1 for p in probes if p["expected_hit_tokens"] > 0)
        print(
            f"{sc.name:16s} probes={len(probes):4d} (hits {hits:4d}) frames={len(frames):4d} "
            f"size={len(data) / 1e6:.2f} MB  {time.perf_counter() - t0:.1f}s"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
