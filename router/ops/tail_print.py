"""How ``kvroute tail`` shows what it receives: batches, events, gaps, restarts, errors.

Rendering only (rich markup or one JSON object per line); ``router.ops.tail`` owns the
sockets and the sequence tracking.

Short hashes are the last 8 hex digits: the same whether the engine sends the 32-byte
digest or its int form (the digest's low 64 bits), so both kinds of engine read alike.
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass
from typing import Any

from rich.console import Console
from rich.markup import escape

from schemas import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    DecodeError,
    DecodeStats,
    decode_batch,
)

_KIND_SHORT = {"full_attention": "full", "sliding_window": "swa", "mla_attention": "mla"}


@dataclass(frozen=True)
class Frame:
    """One message as received: live ``[topic, seq, payload]`` or a replayed one."""

    topic: str
    seq: int
    payload: bytes
    replayed: bool = False


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
        stats = DecodeStats()
        try:
            batch = decode_batch(frame.payload, stats)
        except DecodeError as exc:
            self.error(frame.topic, frame.seq, f"undecodable payload: {exc}")
            return
        skipped = stats.malformed_events + stats.unknown_event_types
        if skipped:  # the decoder leaves such events out of the batch: say so
            self.error(
                frame.topic,
                frame.seq,
                f"{stats.malformed_events} malformed and {stats.unknown_event_types} "
                "unknown-type events skipped",
            )
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
