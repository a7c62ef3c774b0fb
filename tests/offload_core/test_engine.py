"""The simulated engine over real HTTP (uvicorn) and as a `kvroute engine` process."""

from __future__ import annotations

import asyncio
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import uvicorn
import zmq

from offload_core.engine import EngineConfig, SimEngine
from offload_core.engine_app import create_app
from offload_core.engine_cli import build_parser
from router.netutil import free_ports
from schemas import AllBlocksCleared, BlockStored, decode_batch

REPO = Path(__file__).resolve().parents[2]


class Server:
    """uvicorn in a background thread on a free port."""

    def __init__(self, engine: SimEngine) -> None:
        config = uvicorn.Config(create_app(engine), host="127.0.0.1", port=0, log_level="warning")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> str:
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            assert time.monotonic() < deadline, "uvicorn did not start"
            assert self.thread.is_alive(), "uvicorn thread died"
            time.sleep(0.01)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(10)


@pytest.fixture
def engine() -> Iterator[SimEngine]:
    cfg = EngineConfig(worker_id="w0", groups="full:4,swa:4:8", gpu_blocks=64, cpu_blocks=64)
    eng = SimEngine(cfg)
    yield eng
    eng.shutdown()


@pytest.fixture
def base_url(engine: SimEngine) -> Iterator[str]:
    with Server(engine) as url:
        yield url


def complete(url: str, prompt: object, **extra: object) -> httpx.Response:
    return httpx.post(f"{url}/v1/completions", json={"prompt": prompt, **extra}, timeout=30)


def cached(resp: httpx.Response) -> int:
    assert resp.status_code == 200, resp.text
    return resp.json()["usage"]["prompt_tokens_details"]["cached_tokens"]


def test_health_and_vllm_like_usage(base_url: str) -> None:
    assert httpx.get(f"{base_url}/health").json() == {"status": "ok", "worker_id": "w0"}
    r = complete(base_url, list(range(30)), max_tokens=5, model="m")
    body = r.json()
    assert body["object"] == "text_completion" and body["id"].startswith("cmpl-")
    assert body["usage"] == {
        "prompt_tokens": 30,
        "completion_tokens": 5,
        "total_tokens": 35,
        "prompt_tokens_details": {"cached_tokens": 0},
    }


def test_repeated_prompts_report_the_hybrid_hit(base_url: str) -> None:
    prompt = list(range(1000, 1030))
    assert cached(complete(base_url, prompt)) == 0
    assert cached(complete(base_url, prompt)) == 28  # 30 tokens: cap 29, blocks of 4
    assert cached(complete(base_url, [*prompt, 1, 2, 3])) == 28
    assert cached(complete(base_url, prompt[:9])) == 8
    assert cached(complete(base_url, prompt, cache_salt="s")) == 0
    assert cached(complete(base_url, prompt, lora_name="x")) == 0
    assert cached(complete(base_url, prompt, lora_name="x")) == 28


def test_offloaded_blocks_are_loaded_back_and_counted(engine: SimEngine, base_url: str) -> None:
    first = list(range(2000, 2060))  # 15 blocks per group, 30 of the 64
    assert cached(complete(base_url, first)) == 0
    for k in range(3):  # push `first` out of the GPU pool
        complete(base_url, [3000 + 100 * k + i for i in range(60)])
    r = complete(base_url, first)
    assert cached(r) == 56
    kv = r.json()["kv"]
    assert kv["gpu_cached_tokens"] < 56 and kv["loaded_blocks"] > 0
    stats = httpx.get(f"{base_url}/stats").json()
    assert stats["offloaded_blocks"] > 0 and stats["load_verify_failures"] == 0


def test_reset_prefix_cache(base_url: str) -> None:
    prompt = list(range(40))
    complete(base_url, prompt)
    assert httpx.post(f"{base_url}/reset_prefix_cache").json() == {"reset": True}
    assert cached(complete(base_url, prompt)) == 0


def test_bad_input_gets_a_json_4xx_and_the_engine_survives(base_url: str) -> None:
    # vLLM answers a body its request model refuses with 400 "Bad Request", naming the
    # field in ``param``; its error body is {"message", "type", "param", "code": status}.
    cases = [
        ({"prompt": []}, "body.prompt"),
        ({"prompt": "hello"}, None),  # a text prompt needs --tokenizer
        ({"prompt": [1, "x"]}, "body.prompt"),
        ({"prompt": [1, -5]}, None),  # checked past the request model
        ({"prompt": [1, 2**40]}, None),
        ({"prompt": [1.5]}, "body.prompt"),
        ({}, "body.prompt"),
        ({"prompt": list(range(2000))}, None),  # more blocks than the pool has
    ]
    for body, param in cases:
        r = httpx.post(f"{base_url}/v1/completions", json=body, timeout=30)
        assert r.status_code == 400, body
        error = r.json()["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["code"] == 400
        assert error["param"] == param if param is None else error["param"].startswith(param)
    r = httpx.post(f"{base_url}/v1/completions", content=b"{not json", timeout=30)
    assert r.status_code == 400 and r.json()["error"]["type"] == "Bad Request"
    missing = httpx.get(f"{base_url}/nope").json()["error"]
    assert (missing["code"], missing["type"]) == (404, "Not Found")
    assert cached(complete(base_url, [7] * 9)) == 0
    assert cached(complete(base_url, [7] * 9)) == 8


async def test_concurrent_requests_are_serialised(engine: SimEngine, base_url: str) -> None:
    prompt = list(range(5000, 5024))
    async with httpx.AsyncClient(base_url=base_url, timeout=30) as client:
        replies = await asyncio.gather(
            *(client.post("/v1/completions", json={"prompt": prompt}) for _ in range(6))
        )
    hits = sorted(cached(r) for r in replies)
    assert hits == [0, 20, 20, 20, 20, 20]  # exactly one of them computed the prefix
    assert engine.stats.requests == 6


def test_vllm_option_flags_reach_the_engine_and_bad_ones_exit_2(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from offload_core.engine_cli import main

    args = build_parser().parse_args(
        shlex.split(
            "--groups mla:256,swa:64:128 --hash-block-size 64 --eagle --retention-interval 256"
        )
    )
    assert (args.hash_block_size, args.eagle, args.retention_interval) == (64, True, 256)
    assert all(a.help for a in build_parser()._actions if a.dest != "help")
    cfg = EngineConfig(
        groups=args.groups,
        gpu_blocks=64,
        cpu_blocks=0,
        device="cpu",
        hash_block_size=64,
        eagle=True,
        retention_interval=256,
    )
    eng = SimEngine(cfg)
    assert (eng.kv.hash_block_size, eng.kv.eagle, eng.kv.retention) == (64, True, 256)
    prompt = list(range(600))
    eng.serve(prompt)
    # EAGLE drops the last matched 256-token block: 512 would be hit without it.
    assert eng.serve(prompt).cached_tokens == 256
    eng.shutdown()
    # A retention interval that is not a multiple of the lcm (256) is refused at start.
    assert main(["--groups", "mla:256,swa:64:128", "--retention-interval", "100"]) == 2
    assert "retention_interval" in capsys.readouterr().err


def test_cli_flags_match_the_documented_ones() -> None:
    argv = shlex.split(
        "--host 0.0.0.0 --port 1 --worker-id a --publish tcp://*:1 --replay tcp://*:2 "
        "--topic t --gpu-blocks 3 --cpu-blocks 0 --groups full:16,swa:16:1024,mamba:16 "
        "--hash sha256_cbor --cpu-policy arc --num-heads 1 --head-dim 2"
    )
    args = build_parser().parse_args(argv)
    assert (args.gpu_blocks, args.cpu_blocks, args.hash_algo, args.cpu_policy) == (
        3,
        0,
        "sha256_cbor",
        "arc",
    )


def test_kvroute_engine_process_serves_and_publishes() -> None:
    http, pub_port, replay_port = free_ports(3)
    cmd = [
        sys.executable, "-m", "router.cli", "engine",
        "--port", str(http), "--worker-id", "e1",
        "--publish", f"tcp://127.0.0.1:{pub_port}", "--replay", f"tcp://127.0.0.1:{replay_port}",
        "--gpu-blocks", "32", "--cpu-blocks", "0", "--groups", "full:4,swa:4:8",
        "--hash", "sha256_cbor",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    ctx = zmq.Context.instance()
    dealer = ctx.socket(zmq.DEALER)
    try:
        url = f"http://127.0.0.1:{http}"
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
            assert time.monotonic() < deadline, "engine did not come up"
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        prompt = list(range(17))
        assert cached(complete(url, prompt)) == 0
        assert cached(complete(url, prompt)) == 16
        assert httpx.post(f"{url}/reset_prefix_cache").status_code == 200
        # Everything published so far, from the replay socket.
        dealer.connect(f"tcp://127.0.0.1:{replay_port}")
        batches = []
        deadline = time.monotonic() + 20
        while len(batches) < 2 and time.monotonic() < deadline:
            batches = []
            dealer.send_multipart([b"", (0).to_bytes(8, "big")])
            while True:
                assert dealer.poll(10_000), "replay timed out"
                _, topic, _seq, payload = dealer.recv_multipart()
                if topic == b"":
                    break
                assert topic == b"kv@e1"
                batches.append(decode_batch(payload))
        assert len(batches) == 2  # the first request, the reset (the hit stores nothing)
        stored = [e for e in batches[0].events if isinstance(e, BlockStored)]
        assert {(e.group_idx, e.kv_cache_spec_kind, e.medium) for e in stored} == {
            (0, "full_attention", "GPU"),
            (1, "sliding_window", "GPU"),
        }
        assert len(batches[1].events) == 1
        assert isinstance(batches[1].events[0], AllBlocksCleared)
    finally:
        dealer.close(linger=0)
        proc.send_signal(signal.SIGINT)
        try:
            out, _ = proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
    assert proc.returncode == 0, out
    assert "worker e1" in out and "stopped" in out


def test_cpu_store_threshold_offloads_a_block_only_from_its_second_offer() -> None:
    """vLLM's ``store_threshold`` (``--cpu-store-threshold``): a prompt evicted once is
    not offloaded; evicted again after a recompute, it is, and a third run loads it back."""
    cfg = EngineConfig(
        worker_id="w0", groups="full:4", gpu_blocks=24, cpu_blocks=64, cpu_store_threshold=2
    )
    eng = SimEngine(cfg)
    try:
        first = list(range(2000, 2040))  # 10 blocks of the 23 usable

        def push_out(round_: int) -> None:
            for k in range(3):
                eng.serve([5000 + 1000 * round_ + 100 * k + i for i in range(40)])

        eng.serve(first)
        push_out(0)
        assert eng.serve(first).cached_tokens == 0  # offered once: nothing on the CPU tier
        skipped = eng.stats_dict()["cpu_stores_skipped"]
        assert isinstance(skipped, int) and skipped > 0
        push_out(1)
        again = eng.serve(first)
        assert again.cached_tokens == 36 and again.loaded_blocks > 0  # second offer stored
    finally:
        eng.shutdown()
