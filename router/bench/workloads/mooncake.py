"""Loader for Mooncake-format request traces (JSONL).

Each line: ``timestamp`` (ms), ``input_length``, ``output_length``, ``hash_ids`` -- one id
per 512-token block of the prompt, equal ids meaning equal content with an equal prefix.
``len(hash_ids) == ceil(input_length / 512)``: the last block may be partial.

Records are parsed once and kept compact; token ids are expanded per request on
iteration (a full trace expanded at once would be ~145M tokens), so replaying a trace
several times costs a numpy expansion per request, not gigabytes of lists.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import msgspec

from router.bench.workloads.base import DEFAULT_VOCAB, Request, segment_tokens
from router.ratelimited_log import RateLimitedLog

log = logging.getLogger(__name__)

MOONCAKE_BLOCK = 512
_MAX_HASH_ID = 2**64 - 1


class _Line(msgspec.Struct):
    timestamp: float
    input_length: int
    output_length: int
    hash_ids: list[int]


@dataclass(frozen=True, slots=True)
class TraceRecord:
    """One trace line, validated (no tokens yet)."""

    index: int
    arrival: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]

    @property
    def session_id(self) -> str:
        # The trace has no session field; a conversation is identified by its first
        # private block (block 0 is a system prompt that every request shares).
        key = self.hash_ids[1] if len(self.hash_ids) > 1 else self.hash_ids[0]
        return f"mc-{key}"

    def block_lengths(self) -> list[int]:
        n = len(self.hash_ids)
        return [MOONCAKE_BLOCK] * (n - 1) + [self.input_length - MOONCAKE_BLOCK * (n - 1)]


def _validate(line: _Line) -> str | None:
    n = len(line.hash_ids)
    if line.input_length <= 0 or n == 0:
        return "empty prompt"
    if n != -(-line.input_length // MOONCAKE_BLOCK):
        return "len(hash_ids) != ceil(input_length / 512)"
    if line.output_length < 0 or line.timestamp < 0:
        return "negative output_length or timestamp"
    if any(h < 0 for h in line.hash_ids):
        return "negative hash id"
    if any(h > _MAX_HASH_ID for h in line.hash_ids):
        return "hash id above 2**64 - 1"  # token expansion is uint64 arithmetic
    return None


class MooncakeTrace:
    """A Mooncake trace: ``records`` (validated lines) and iteration as ``Request``.

    Malformed or inconsistent lines are skipped and counted in ``skipped`` (logged rate-limited),
    never fatal. Records are in arrival order (a stable sort by ``timestamp``), timed from
    the earliest. ``time_scale`` divides inter-arrival times (2.0 = twice as fast).
    """

    def __init__(
        self,
        path: str | Path,
        *,
        limit: int | None = None,
        seed: int = 0,
        vocab: int = DEFAULT_VOCAB,
        time_scale: float = 1.0,
    ) -> None:
        if not 0 < time_scale < math.inf:
            raise ValueError("time_scale must be a positive finite number")
        self.path = Path(path)
        self.seed = seed
        self.vocab = vocab
        self.skipped = 0
        self._limited = RateLimitedLog(log, burst=5, interval_s=10.0)
        self.records: list[TraceRecord] = []
        decoder = msgspec.json.Decoder(_Line)
        lines: list[_Line] = []
        with self.path.open("rb") as fh:
            for lineno, raw in enumerate(fh):
                if limit is not None and len(lines) >= limit:
                    break
                if not raw.strip():
                    continue
                try:
                    line = decoder.decode(raw)
                except msgspec.DecodeError as exc:
                    self._skip(lineno, str(exc))
                    continue
                problem = _validate(line)
                if problem is not None:
                    self._skip(lineno, problem)
                    continue
                lines.append(line)
        # Replayed in arrival order from the earliest: lines out of order arrived before
        # the first one (negative times) and queued behind later work (inflated TTFTs).
        lines.sort(key=lambda ln: ln.timestamp)
        t0 = lines[0].timestamp if lines else 0.0
        self.records = [
            TraceRecord(
                index=i,
                arrival=(line.timestamp - t0) / 1000.0 / time_scale,
                input_length=line.input_length,
                output_length=line.output_length,
                hash_ids=tuple(line.hash_ids),
            )
            for i, line in enumerate(lines)
        ]

    def _skip(self, lineno: int, why: str) -> None:
        self.skipped += 1
        self._limited.warning(
            "skip", "%s:%d: skipping malformed trace line (%s)", self.path, lineno + 1, why
        )

    def __len__(self) -> int:
        return len(self.records)

    def tokens(self, record: TraceRecord) -> list[int]:
        """Token ids of a record: each hash id expanded to its 512 (or fewer) tokens."""
        return segment_tokens(record.hash_ids, record.block_lengths(), self.seed, self.vocab)

    def request(self, record: TraceRecord) -> Request:
        return Request(
            request_id=f"r{record.index}",
            arrival=record.arrival,
            token_ids=self.tokens(record),
            output_tokens=record.output_length,
            session_id=record.session_id,
            kind="trace",
        )

    def __iter__(self) -> Iterator[Request]:
        for record in self.records:
            yield self.request(record)
