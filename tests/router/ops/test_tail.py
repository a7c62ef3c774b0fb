"""``kvroute tail`` against real ZMQ sockets fed with the golden vLLM 0.33 frames.

The fake engine is an XPUB (so the test can wait for the tail's subscription instead of
sleeping) plus a ROUTER that answers replay requests like vLLM's publisher does.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
import zmq

from router.ops import tail
from schemas import decode_batch

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "vllm-0.33"
ROOT = Path(__file__).resolve().parents[3]
LIVE: list[list[bytes]] = msgspec.msgpack.decode(
    (FIXTURES / "frames" / "live.msgpack").read_bytes()
)
MANIFEST = json.loads((FIXTURES / "manifest.json").read_text())
TOPIC = MANIFEST["frames"]["topic"]
END = [b"", b"", (-1).to_bytes(8, "big", signed=True), b""]


def _seq(n: int) -> bytes:
    return n.to_bytes(8, "big")


class FakeEngine:
    """XPUB + replay ROUTER on free loopback ports, serving the golden frames."""

    def __init__(self) -> None:
        self.ctx: zmq.Context[Any] = zmq.Context()
        self.pub = self.ctx.socket(zmq.XPUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.pub.bind("tcp://127.0.0.1:*")
        self.endpoint = self.pub.getsockopt_string(zmq.LAST_ENDPOINT)
        self.router = self.ctx.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 0)
        self.router.bind("tcp://127.0.0.1:*")
        self.replay_endpoint = self.router.getsockopt_string(zmq.LAST_ENDPOINT)
        self.buffer: dict[int, list[bytes]] = {}
        self.requests: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve_replay, daemon=True)
        self._thread.start()

    def _serve_replay(self) -> None:
        while not self._stop.is_set():
            if not self.router.poll(50):
                continue
            ident, _empty, start = self.router.recv_multipart()
            first = int.from_bytes(start, "big")
            self.requests.append(first)
            for seq in sorted(self.buffer):
                if seq >= first:
                    self.router.send_multipart([ident, b"", *self.buffer[seq]])
            self.router.send_multipart([ident, *END])

    def wait_subscribed(self, timeout: float = 10.0) -> bytes:
        assert self.pub.poll(int(timeout * 1000)), "tail never subscribed"
        return self.pub.recv()

    def send(self, frames: list[bytes], buffer: bool = True) -> None:
        if buffer and len(frames) == 3 and len(frames[1]) == 8:
            self.buffer[int.from_bytes(frames[1], "big")] = list(frames)
        self.pub.send_multipart(frames)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.pub.close()
        self.router.close()
        self.ctx.term()


@pytest.fixture
def engine() -> Iterator[FakeEngine]:
    eng = FakeEngine()
    yield eng
    eng.close()


class TailThread:
    """Runs ``tail.main(argv)`` in a thread; stdout is captured by pytest's capsys."""

    def __init__(self, argv: list[str]) -> None:
        self.rc: int | None = None
        self._thread = threading.Thread(target=self._run, args=(argv,), daemon=True)
        self._thread.start()

    def _run(self, argv: list[str]) -> None:
        self.rc = tail.main(argv)

    def join(self, timeout: float = 20.0) -> int:
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "tail did not exit"
        assert self.rc is not None
        return self.rc


def _lines(text: str) -> list[str]:
    return [line.rstrip() for line in text.splitlines() if line.strip()]


def test_pretty_prints_golden_live_frames(engine: FakeEngine, capsys: pytest.CaptureFixture[str]):
    runner = TailThread([engine.endpoint, "--count", "5", "--idle-timeout", "20"])
    assert engine.wait_subscribed() == b"\x01"
    for frames in LIVE:
        engine.send(frames)
    assert runner.join() == 0
    out = capsys.readouterr().out
    headers = [line for line in _lines(out) if line.startswith("#")]
    assert [h.split()[0] for h in headers] == ["#0", "#1", "#2", "#3", "#4"]
    assert all(TOPIC in h for h in headers)
    assert "gap" not in out and "error" not in out
    # Every event of every golden batch is shown with its type, group and tier.
    cases = list(MANIFEST["cases"].values())
    n_events = sum(len(c["events"]) for c in cases)
    event_lines = [line for line in _lines(out) if line.startswith("  ")]
    assert len(event_lines) == n_events
    assert "dp=1" in out and "dp=0" in out
    assert "x AllBlocksCleared" in out
    # hybrid_groups: full + sliding window (32 tokens) groups, 4 blocks each.
    assert any("g1" in ln and "swa:32" in ln and "4 blocks" in ln for ln in event_lines)
    # Short hashes are the last 8 hex digits of the int form...
    first_int = cases[0]["events"][0]["block_hashes"][0]
    assert f"{first_int:016x}"[-8:] in out
    # ... and of a 32-byte digest.
    digest_hex = cases[2]["events"][0]["block_hashes"][0]["bytes_hex"]
    assert digest_hex[-8:] in out
    assert "CPU" in out


def test_json_output_matches_manifest(engine: FakeEngine, capsys: pytest.CaptureFixture[str]):
    runner = TailThread([engine.endpoint, "--json", "--count", "5", "--topic", TOPIC[:3]])
    assert engine.wait_subscribed() == b"\x01" + TOPIC[:3].encode()
    for frames in LIVE:
        engine.send(frames)
    assert runner.join() == 0
    records = [json.loads(line) for line in _lines(capsys.readouterr().out)]
    assert [r["seq"] for r in records] == [0, 1, 2, 3, 4]
    for record, case, frames in zip(records, MANIFEST["cases"].values(), LIVE, strict=True):
        assert record["topic"] == TOPIC
        assert record["ts"] == case["ts"]
        assert record["dp_rank"] == decode_batch(frames[2]).data_parallel_rank
        assert record["replayed"] is False
        assert [e["type"] for e in record["events"]] == [e["type"] for e in case["events"]]
        for got, want in zip(record["events"], case["events"], strict=True):
            if want["type"] == "AllBlocksCleared":
                continue
            assert got["blocks"] == len(want["block_hashes"])
            assert got["group"] == want["group_idx"]
            assert got["medium"] == want["medium"]
            first = want["block_hashes"][0]
            want_hex = first["bytes_hex"] if isinstance(first, dict) else f"{first:016x}"
            assert got["first"] == want_hex


def test_topic_filter_skips_other_topics(engine: FakeEngine, capsys: pytest.CaptureFixture[str]):
    runner = TailThread([engine.endpoint, "--json", "--count", "1", "--topic", "kv@worker-0"])
    engine.wait_subscribed()
    _topic, seq, payload = LIVE[0]
    engine.send([b"kv@worker-9@other", seq, payload], buffer=False)
    engine.send(LIVE[0])
    assert runner.join() == 0
    records = [json.loads(line) for line in _lines(capsys.readouterr().out)]
    assert [r["topic"] for r in records] == [TOPIC]


def test_gap_is_shown_without_replay(engine: FakeEngine, capsys: pytest.CaptureFixture[str]):
    runner = TailThread([engine.endpoint, "--count", "3"])
    engine.wait_subscribed()
    for frames in (LIVE[0], LIVE[1], LIVE[4]):
        engine.send(frames)
    assert runner.join() == 0
    lines = _lines(capsys.readouterr().out)
    gap = [line for line in lines if line.startswith("gap")]
    assert len(gap) == 1
    assert "missing seq 2..3" in gap[0] and "2 batches" in gap[0] and "--replay" in gap[0]
    order = [line.split()[0] for line in lines if line.startswith(("#", "gap"))]
    assert order == ["#0", "#1", "gap", "#4"]


def test_gap_is_filled_by_replay(engine: FakeEngine, capsys: pytest.CaptureFixture[str]):
    runner = TailThread([engine.endpoint, "--replay", engine.replay_endpoint, "--count", "5"])
    engine.wait_subscribed()
    for frames in LIVE[:4]:
        engine.buffer[int.from_bytes(frames[1], "big")] = list(frames)
    for frames in (LIVE[0], LIVE[1], LIVE[4]):
        engine.send(frames)
    assert runner.join() == 0
    lines = _lines(capsys.readouterr().out)
    order = [line.split()[0] for line in lines if line.startswith(("#", "gap"))]
    assert order == ["#0", "#1", "gap", "#2", "#3", "#4"]
    replayed = [line.split()[0] for line in lines if "(replayed)" in line]
    assert replayed == ["#2", "#3"]
    assert engine.requests == [2]


def test_from_seq_replays_first_then_dedups_live(
    engine: FakeEngine, capsys: pytest.CaptureFixture[str]
):
    for frames in LIVE:
        engine.buffer[int.from_bytes(frames[1], "big")] = list(frames)
    argv = [engine.endpoint, "--replay", engine.replay_endpoint, "--from-seq", "2"]
    runner = TailThread([*argv, "--json", "--count", "4"])
    engine.wait_subscribed()
    deadline = time.monotonic() + 10
    while not engine.requests and time.monotonic() < deadline:
        time.sleep(0.01)
    assert engine.requests == [2]
    engine.send(LIVE[4])  # already printed from the replay: a duplicate, not a restart
    engine.send([LIVE[4][0], _seq(5), LIVE[4][2]])
    assert runner.join() == 0
    records = [json.loads(line) for line in _lines(capsys.readouterr().out)]
    assert [(r["seq"], r["replayed"]) for r in records] == [
        (2, True),
        (3, True),
        (4, True),
        (5, False),
    ]


def test_garbage_and_restart_are_reported_not_fatal(
    engine: FakeEngine, capsys: pytest.CaptureFixture[str]
):
    runner = TailThread([engine.endpoint, "--count", "4"])
    engine.wait_subscribed()
    engine.send(LIVE[0])
    engine.send([TOPIC.encode(), _seq(1), b"\xc1 not msgpack"])
    engine.send([TOPIC.encode(), b"short"], buffer=False)
    engine.send(LIVE[2])
    engine.send(LIVE[0])  # seq went backwards: the publisher restarted
    assert runner.join() == 0
    lines = _lines(capsys.readouterr().out)
    errors = [line for line in lines if line.startswith("error")]
    assert len(errors) == 2
    assert "#1" in errors[0] and "undecodable" in errors[0]
    assert "malformed message" in errors[1]
    assert any(line.startswith("restart") and "2 -> 0" in line for line in lines)
    assert [line.split()[0] for line in lines if line.startswith("#")] == ["#0", "#2", "#0"]


def test_replay_endpoint_silent_is_an_error_not_a_hang(capsys: pytest.CaptureFixture[str]):
    ctx: zmq.Context[Any] = zmq.Context()
    silent = ctx.socket(zmq.ROUTER)
    silent.setsockopt(zmq.LINGER, 0)
    silent.bind("tcp://127.0.0.1:*")
    try:
        endpoint = silent.getsockopt_string(zmq.LAST_ENDPOINT)
        items = tail.fetch_replay(ctx, endpoint, 0, timeout_s=0.3)
        assert len(items) == 1 and isinstance(items[0], str) and "timed out" in items[0]
    finally:
        silent.close()
        ctx.term()


def test_cli_subprocess_json(engine: FakeEngine):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "router.cli", "tail", engine.endpoint, "--json", "--count", "2"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    try:
        engine.wait_subscribed(timeout=30)
        engine.send(LIVE[0])
        engine.send(LIVE[1])
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    records = [json.loads(line) for line in out.decode().splitlines()]
    assert [r["seq"] for r in records] == [0, 1]


def test_from_seq_requires_replay():
    with pytest.raises(SystemExit):
        tail.main(["tcp://127.0.0.1:1", "--from-seq", "3"])


def test_replays_history_from_our_publisher(capsys: pytest.CaptureFixture[str]):
    """Against the project's own ``ZmqEventPublisher``: batches published before the tail
    started come back through its replay socket, then the stream continues in order (a
    live batch lost while the subscription was being set up is fetched by replay too)."""
    from publisher.zmq_publisher import ZmqEventPublisher

    pub = ZmqEventPublisher("tcp://127.0.0.1:*", replay_endpoint="tcp://127.0.0.1:*", topic="kv@w")
    try:
        payloads = [frames[2] for frames in LIVE]
        for payload in payloads[:3]:
            pub.publish(decode_batch(payload))
        deadline = time.monotonic() + 20
        while pub.counters()["published"] < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        argv = [pub.bound_endpoint, "--replay", pub.bound_replay_endpoint, "--from-seq", "1"]
        runner = TailThread([*argv, "--json", "--count", "3"])
        # Keep publishing until the tail has its three batches (seq 1, 2 replayed, then 3).
        i = 3
        while runner.rc is None and time.monotonic() < deadline:
            pub.publish(decode_batch(payloads[i % len(payloads)]))
            i += 1
            time.sleep(0.05)
        rc = runner.join()
    finally:
        pub.shutdown()
    assert rc == 0
    records = [json.loads(line) for line in _lines(capsys.readouterr().out)]
    seqs = [r["seq"] for r in records if "seq" in r]
    assert seqs == [1, 2, 3]
    assert all(r["topic"] == "kv@w" for r in records if "seq" in r)
    assert [r["replayed"] for r in records if "seq" in r][:2] == [True, True]


def _wait_replay_asked(engine: FakeEngine) -> None:
    deadline = time.monotonic() + 10
    while not engine.requests and time.monotonic() < deadline:
        time.sleep(0.01)
    assert engine.requests


def test_from_seq_replay_honours_the_topic_filter(
    engine: FakeEngine, capsys: pytest.CaptureFixture[str]
):
    """--topic filtered the live frames but not the --from-seq replay."""
    for frames in LIVE[:3]:
        engine.buffer[int.from_bytes(frames[1], "big")] = list(frames)
    _topic, _seq_bytes, payload = LIVE[3]
    argv = [engine.endpoint, "--replay", engine.replay_endpoint, "--from-seq", "0"]
    runner = TailThread([*argv, "--json", "--count", "1", "--topic", "kv@nomatch"])
    engine.wait_subscribed()
    _wait_replay_asked(engine)
    engine.send([b"kv@nomatch", _seq(0), payload], buffer=False)
    assert runner.join() == 0
    records = [json.loads(line) for line in _lines(capsys.readouterr().out)]
    assert [(r["topic"], r["seq"], r["replayed"]) for r in records] == [("kv@nomatch", 0, False)]


def test_a_restart_after_the_from_seq_replay_is_shown(
    engine: FakeEngine, capsys: pytest.CaptureFixture[str]
):
    """A live batch under a seq the replay printed was always taken for its duplicate:
    a publisher that restarted from 0 went unnoticed. A different batch is a restart."""
    for frames in LIVE[:3]:
        engine.buffer[int.from_bytes(frames[1], "big")] = list(frames)
    argv = [engine.endpoint, "--replay", engine.replay_endpoint, "--from-seq", "0"]
    runner = TailThread([*argv, "--count", "4"])
    engine.wait_subscribed()
    _wait_replay_asked(engine)
    engine.send([LIVE[0][0], _seq(0), LIVE[3][2]])  # seq 0 again, another batch
    assert runner.join() == 0
    lines = _lines(capsys.readouterr().out)
    assert any(line.startswith("restart") and "2 -> 0" in line for line in lines), lines
    assert [line.split()[0] for line in lines if line.startswith("#")] == ["#0", "#1", "#2", "#0"]


def test_events_the_decoder_skips_are_reported(
    engine: FakeEngine, capsys: pytest.CaptureFixture[str]
):
    batch = msgspec.msgpack.decode(LIVE[0][2])
    batch[1].append(["BlockMoved", [1], "GPU"])  # an event type no engine sends
    runner = TailThread([engine.endpoint, "--count", "1"])
    engine.wait_subscribed()
    engine.send([LIVE[0][0], LIVE[0][1], msgspec.msgpack.encode(batch)])
    assert runner.join() == 0
    lines = _lines(capsys.readouterr().out)
    assert any(line.startswith("error") and "1 unknown-type" in line for line in lines), lines
