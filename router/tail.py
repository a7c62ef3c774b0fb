"""``kvroute tail``: pretty-print a live vLLM-format KV event stream.

A debugging tool for engine operators: it shows what an engine actually publishes (batch
seq, topic, time, DP rank, and each event's group, tier, block count and hashes), where
sequence numbers jump (lost batches), and with ``--replay`` fetches the missed batches
from the engine's replay socket, exactly as the router would. Nothing it receives is
fatal: undecodable payloads and malformed frames are printed and skipped.

Short hashes are the last 8 hex digits: the same whether the engine sends the 32-byte
digest or its int form (the digest's low 64 bits), so both kinds of engine read alike.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from dataclasses import dataclass, field
from typing import Any

import zmq
from rich.console import Console
from rich.markup import escape

from schemas import AllBlocksCleared, BlockRemoved, BlockStored, DecodeError, decode_batch

END_MARKER_SEQ = -1
_KIND_SHORT = {"full_attention": "full", "sliding_window": "swa", "mla_attention": "mla"}


@dataclass(frozen=True)
class Frame:
    """One message as received: live ``[topic, seq, payload]`` or a replayed one."""

    topic: str
    seq: int
    payload: bytes
    replayed: bool = False


@dataclass
class TailState:
    """Per-topic sequence tracking (one topic = one publisher)."""

    last_seq: dict[str, int] = field(default_factory=dict)
    batches: int = 0


def hash_hex(value: int | bytes | None) -> str | None:
    """Full hex of a wire hash: 16 digits for the int form, 64 for a digest."""
    if value is None:
        return None
    if isinstance(value, bytes):
        return value.hex()
    return f"{value & 0xFFFFFFFFFFFFFFFF:016x}"


def describe_event(event: Any) -> dict[str, Any]:
    """A JSON-ready summary of one event (full hashes; the pretty printer shortens them)."""
    if isinstance(event, BlockStored | BlockRemoved):
        hashes = event.block_hashes
        info: dict[str, Any] = {
            "type": "BlockStored" if isinstance(event, BlockStored) else "BlockRemoved",
            "group": event.group_idx,
            "medium": event.medium,
            "blocks": len(hashes),
            "first": hash_hex(hashes[0]) if hashes else None,
            "last": hash_hex(hashes[-1]) if hashes else None,
        }
        if isinstance(event, BlockStored):
            info["parent"] = hash_hex(event.parent_block_hash)
            info["tokens"] = len(event.token_ids)
            info["block_size"] = event.block_size
            info["kind"] = event.kv_cache_spec_kind
            info["window"] = event.kv_cache_spec_sliding_window
            info["lora"] = event.lora_name
        return info
    if isinstance(event, AllBlocksCleared):
        return {"type": "AllBlocksCleared"}
    return {"type": type(event).__name__}


def _plural(n: int, noun: str, suffix: str = "s") -> str:
    return f"{n} {noun}{suffix if n != 1 else ''}"


def _topic_label(topic: str) -> str:
    return escape(topic) or "(no topic)"


def _span(info: dict[str, Any]) -> str:
    first, last = info.get("first"), info.get("last")
    if first is None:
        return "-"
    if info["blocks"] == 1:
        return first[-8:]
    return f"{first[-8:]}..{last[-8:] if last else '-'}"


def _event_line(info: dict[str, Any]) -> str:
    kind = info["type"]
    if kind == "AllBlocksCleared":
        return "  [bold magenta]x AllBlocksCleared[/]"
    group = "g-" if info["group"] is None else f"g{info['group']}"
    medium = info["medium"] or "GPU?"
    blocks = _plural(info["blocks"], "block")
    if kind == "BlockStored":
        spec = _KIND_SHORT.get(info["kind"] or "", info["kind"] or "")
        if info["window"]:
            spec += f":{info['window']}"
        parent = info["parent"][-8:] if info["parent"] else "-"
        extra = f" lora={escape(info['lora'])}" if info["lora"] else ""
        return (
            f"  [green]+ stored [/] {group:<3} {medium:<7} {blocks:<10} {_span(info):<18} "
            f"parent={parent} bs={info['block_size']} tok={info['tokens']}"
            f"{' ' + spec if spec else ''}{extra}"
        )
    if kind == "BlockRemoved":
        return f"  [red]- removed[/] {group:<3} {medium:<7} {blocks:<10} {_span(info)}"
    return f"  [yellow]? {escape(kind)}[/]"


def _ts_text(ts: float) -> str:
    try:
        stamp = dt.datetime.fromtimestamp(ts, tz=dt.UTC)
    except (OverflowError, OSError, ValueError):
        return repr(ts)
    return stamp.strftime("%H:%M:%S.%f")[:-3] + "Z"


class Printer:
    """Renders batches, gaps and errors as rich text or one JSON object per line."""

    def __init__(self, console: Console, as_json: bool) -> None:
        self.console = console
        self.as_json = as_json

    def _json(self, obj: dict[str, Any]) -> None:
        self.console.out(json.dumps(obj, separators=(",", ":")), highlight=False)

    def batch(self, frame: Frame) -> None:
        try:
            batch = decode_batch(frame.payload)
        except DecodeError as exc:
            self.error(frame.topic, frame.seq, f"undecodable payload: {exc}")
            return
        events = [describe_event(e) for e in batch.events]
        if self.as_json:
            self._json(
                {
                    "seq": frame.seq,
                    "topic": frame.topic,
                    "ts": batch.ts,
                    "dp_rank": batch.data_parallel_rank,
                    "replayed": frame.replayed,
                    "events": events,
                }
            )
            return
        dp = "-" if batch.data_parallel_rank is None else str(batch.data_parallel_rank)
        tag = " [cyan](replayed)[/]" if frame.replayed else ""
        self.console.print(
            f"[bold]#{frame.seq}[/] [blue]{_topic_label(frame.topic)}[/] "
            f"{_ts_text(batch.ts)} dp={dp} {_plural(len(events), 'event')}{tag}",
            highlight=False,
        )
        for info in events:
            self.console.print(_event_line(info), highlight=False)

    def gap(self, topic: str, first: int, last: int, replaying: bool) -> None:
        count = last - first + 1
        if self.as_json:
            self._json({"gap": {"topic": topic, "first": first, "last": last, "count": count}})
            return
        hint = "fetching via replay" if replaying else "use --replay to fetch them"
        self.console.print(
            f"[bold yellow]gap[/] {_topic_label(topic)}: missing seq {first}..{last} "
            f"({_plural(count, 'batch', 'es')}; {hint})",
            highlight=False,
        )

    def restart(self, topic: str, last: int, seq: int) -> None:
        if self.as_json:
            self._json({"restart": {"topic": topic, "last_seq": last, "seq": seq}})
            return
        self.console.print(
            f"[bold yellow]restart[/] {_topic_label(topic)}: seq went back "
            f"{last} -> {seq} (publisher restarted?)",
            highlight=False,
        )

    def error(self, topic: str | None, seq: int | None, message: str) -> None:
        if self.as_json:
            self._json({"error": {"topic": topic, "seq": seq, "message": message}})
            return
        where = f" #{seq}" if seq is not None else ""
        self.console.print(f"[bold red]error[/]{where}: {escape(message)}", highlight=False)


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

    Returns frames, plus error strings for malformed replies; an unreachable or silent
    endpoint yields a single error after ``timeout_s``.
    """
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    out: list[Frame | str] = []
    try:
        sock.connect(subscriber_endpoint(endpoint))
        sock.send_multipart([b"", start_seq.to_bytes(8, "big")])
        while True:
            if not sock.poll(int(timeout_s * 1000)):
                out.append(f"replay from {endpoint} timed out after {timeout_s:g}s")
                return out
            parts = sock.recv_multipart()
            if len(parts) != 4 or parts[0] != b"":
                out.append(f"malformed replay reply ({len(parts)} frames)")
                continue
            _, topic, seq, payload = parts
            if len(seq) != 8:
                out.append(f"replay seq frame must be 8 bytes, got {len(seq)}")
                continue
            if int.from_bytes(seq, "big", signed=True) == END_MARKER_SEQ and not payload:
                return out
            out.append(
                Frame(topic.decode("utf-8", "replace"), int.from_bytes(seq, "big"), payload, True)
            )
    finally:
        sock.close()


class Tail:
    """Sequence tracking, gap handling and replay around a ``Printer``."""

    def __init__(self, printer: Printer, ctx: zmq.Context[Any], args: argparse.Namespace) -> None:
        self.printer = printer
        self.ctx = ctx
        self.replay: str | None = args.replay
        self.replay_timeout: float = args.replay_timeout
        self.count: int | None = args.count
        self.state = TailState()
        # Highest seq already printed from an initial --from-seq replay, per topic: live
        # copies of those batches are duplicates, not a publisher restart.
        self._replayed_upto: dict[str, int] = {}

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
            if item.seq < start_seq or (below is not None and item.seq >= below):
                continue
            last = self.state.last_seq.get(item.topic)
            if last is not None and item.seq <= last:
                continue
            self._emit(item)
            printed += 1
        return printed

    def initial_replay(self, from_seq: int) -> None:
        self.replay_from(from_seq, None, None)
        self._replayed_upto = dict(self.state.last_seq)

    def on_live(self, frame: Frame) -> None:
        topic, seq = frame.topic, frame.seq
        upto = self._replayed_upto.get(topic)
        if upto is not None:
            if seq <= upto:
                return
            del self._replayed_upto[topic]
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
