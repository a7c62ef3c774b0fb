"""``kvroute tail``: pretty-print a live vLLM-format KV event stream.

A debugging tool for engine operators: it shows what an engine actually publishes (batch
seq, topic, time, DP rank, and each event's group, tier, block count and hashes), where
sequence numbers jump (lost batches), and with ``--replay`` fetches the missed batches
from the engine's replay socket, exactly as the router would. Nothing it receives is
fatal: undecodable payloads and malformed frames are printed and skipped.

Output formatting lives in ``router.ops.tail_print``.
"""

from __future__ import annotations

import argparse
import sys
import zlib
from dataclasses import dataclass, field
from typing import Any

import zmq
from rich.console import Console

from router.ingest.replay_client import ReplayFailed, request_replay_sync
from router.ops.tail_print import Frame, Printer


@dataclass
class TailState:
    """Per-topic sequence tracking (one topic = one publisher)."""

    last_seq: dict[str, int] = field(default_factory=dict)
    batches: int = 0


def subscriber_endpoint(endpoint: str) -> str:
    """Where a consumer connects for an engine-side endpoint (``*`` means this host)."""
    return endpoint.replace("://*:", "://127.0.0.1:")


def parse_live(parts: list[bytes]) -> Frame | str:
    """A live multipart message, or a description of why it is malformed."""
    if len(parts) != 3:
        return f"expected 3 frames [topic, seq, payload], got {len(parts)}"
    topic, seq, payload = parts
    if len(seq) != 8:
        return f"seq frame must be 8 bytes, got {len(seq)}"
    return Frame(topic.decode("utf-8", "replace"), int.from_bytes(seq, "big"), payload)


def fetch_replay(ctx: zmq.Context[Any], endpoint: str, start_seq: int, timeout_s: float) -> list:
    """Ask a replay ROUTER for every buffered batch ``seq >= start_seq`` (until its end marker).

    The router's replay client does the asking (``request_replay_sync``). Returns frames,
    then one error string for malformed replies and one for a failure (a silent endpoint
    after ``timeout_s``); frames that arrived before a failure are kept, for display.
    """
    error: str | None = None
    try:
        frames, malformed = request_replay_sync(
            ctx, subscriber_endpoint(endpoint), start_seq, timeout_s=timeout_s
        )
    except ReplayFailed as exc:
        frames, malformed = exc.frames, exc.malformed
        error = str(exc).replace("no reply within", "timed out after")
    out: list[Frame | str] = [
        Frame((f.topic or b"").decode("utf-8", "replace"), f.seq, f.payload, True) for f in frames
    ]
    if malformed:
        out.append(f"{malformed} malformed replay replies skipped")
    if error is not None:
        out.append(error)
    return out


class Tail:
    """Sequence tracking, gap handling and replay around a ``Printer``."""

    def __init__(self, printer: Printer, ctx: zmq.Context[Any], args: argparse.Namespace) -> None:
        self.printer = printer
        self.ctx = ctx
        self.replay: str | None = args.replay
        self.replay_timeout: float = args.replay_timeout
        self.count: int | None = args.count
        self.state = TailState()
        # The live socket's --topic prefix filter, applied to replayed frames too.
        self.topic_prefix: str = args.topic or ""
        # Highest seq already printed from an initial --from-seq replay, per topic, and
        # each printed batch's checksum: a live copy of one of those batches is a
        # duplicate; a different batch under such a seq is a publisher that restarted.
        self._replayed_upto: dict[str, int] = {}
        self._replayed_crc: dict[tuple[str, int], int] = {}
        self._recording = False

    @property
    def done(self) -> bool:
        return self.count is not None and self.state.batches >= self.count

    def _emit(self, frame: Frame) -> None:
        if self.done:
            return
        self.printer.batch(frame)
        self.state.last_seq[frame.topic] = frame.seq
        self.state.batches += 1

    def replay_from(self, start_seq: int, topic: str | None, below: int | None) -> int:
        """Print replayed batches ``start_seq <= seq < below`` (of ``topic`` if given)."""
        assert self.replay is not None
        printed = 0
        for item in fetch_replay(self.ctx, self.replay, start_seq, self.replay_timeout):
            if isinstance(item, str):
                self.printer.error(topic, None, item)
                continue
            if topic is not None and item.topic != topic:
                continue
            if not item.topic.startswith(self.topic_prefix):
                continue
            if item.seq < start_seq or (below is not None and item.seq >= below):
                continue
            last = self.state.last_seq.get(item.topic)
            if last is not None and item.seq <= last:
                continue
            self._emit_replayed(item)
            self._emit(item)
            printed += 1
        return printed

    def initial_replay(self, from_seq: int) -> None:
        self._recording = True
        try:
            self.replay_from(from_seq, None, None)
        finally:
            self._recording = False
        self._replayed_upto = dict(self.state.last_seq)

    def _emit_replayed(self, frame: Frame) -> None:
        if self._recording:  # only the initial replay's batches (bounded by the buffer)
            self._replayed_crc[frame.topic, frame.seq] = zlib.crc32(frame.payload)

    def on_live(self, frame: Frame) -> None:
        topic, seq = frame.topic, frame.seq
        upto = self._replayed_upto.get(topic)
        if upto is not None:
            same = self._replayed_crc.get((topic, seq)) == zlib.crc32(frame.payload)
            if seq <= upto and same:
                return  # the live copy of a batch the replay printed
            del self._replayed_upto[topic]  # past the replay, or a restarted publisher
            self._replayed_crc = {k: v for k, v in self._replayed_crc.items() if k[0] != topic}
        last = self.state.last_seq.get(topic)
        if last is not None and seq <= last:
            self.printer.restart(topic, last, seq)
        elif last is not None and seq > last + 1:
            self.printer.gap(topic, last + 1, seq - 1, self.replay is not None)
            if self.replay is not None:
                got = self.replay_from(last + 1, topic, seq)
                if got < seq - last - 1 and not self.done:
                    self.printer.error(
                        topic,
                        None,
                        f"replay supplied {got} of {seq - last - 1} missing batches "
                        "(older than the publisher's buffer?)",
                    )
        self._emit(frame)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kvroute tail",
        description="Pretty-print a live vLLM-format KV event stream (ZMQ PUB), show gaps.",
    )
    parser.add_argument("endpoint", help="engine PUB endpoint, e.g. tcp://127.0.0.1:5557")
    parser.add_argument("--replay", metavar="ENDPOINT", help="engine replay ROUTER endpoint")
    parser.add_argument("--topic", default="", help="topic prefix filter (default: every topic)")
    parser.add_argument(
        "--from-seq", type=int, metavar="N", help="first replay batches seq >= N (needs --replay)"
    )
    parser.add_argument("--count", type=int, metavar="N", help="exit after N batches")
    parser.add_argument("--json", action="store_true", help="one JSON object per line")
    parser.add_argument(
        "--bind", action="store_true", help="bind ENDPOINT instead of connecting (engine connects)"
    )
    parser.add_argument(
        "--idle-timeout",
        type=float,
        metavar="S",
        help="exit with status 1 after S seconds without a message",
    )
    parser.add_argument(
        "--replay-timeout", type=float, default=3.0, metavar="S", help="replay answer timeout"
    )
    return parser


def run(args: argparse.Namespace, console: Console) -> int:
    """The tail loop; returns the exit status."""
    ctx: zmq.Context[Any] = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.SUBSCRIBE, args.topic.encode())
    printer = Printer(console, args.json)
    tail = Tail(printer, ctx, args)
    try:
        if args.bind:
            sub.bind(args.endpoint)
        else:
            sub.connect(subscriber_endpoint(args.endpoint))
        if args.from_seq is not None:
            tail.initial_replay(args.from_seq)
        idle_ms = 0.0
        while not tail.done:
            if not sub.poll(200):
                idle_ms += 200
                if args.idle_timeout is not None and idle_ms >= args.idle_timeout * 1000:
                    printer.error(None, None, f"no message for {args.idle_timeout:g}s")
                    return 1
                continue
            idle_ms = 0.0
            parsed = parse_live(sub.recv_multipart())
            if isinstance(parsed, str):
                printer.error(None, None, f"malformed message: {parsed}")
                continue
            tail.on_live(parsed)
        return 0
    except KeyboardInterrupt:
        return 0
    except zmq.ZMQError as exc:
        printer.error(None, None, f"zmq: {exc}")
        return 2
    finally:
        sub.close()
        ctx.term()


def main(argv: list[str]) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.from_seq is not None and args.replay is None:
        parser.error("--from-seq needs --replay ENDPOINT")
    console = Console(file=sys.stdout, soft_wrap=True, highlight=False)
    return run(args, console)
