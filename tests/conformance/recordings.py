"""Load the vLLM conformance recordings and replay them through kvroute.

Recordings (``tests/fixtures/vllm-conformance/*.msgpack``, format in that folder's
README) hold vLLM 0.33's own frames and its prefix-cache answers. ``replay`` feeds every
frame, in order, through kvroute's real decode + ingest path (one kvroute worker per DP
rank) and asks kvroute's scorer at every probe.

``KvrouteUnderTest`` is the one place that knows how kvroute is told an engine's
settings and asked for a worker's score: per-worker engine settings (``hash_block_size``,
``eagle``, ``partial_hash_hits``) and the request flag ``skip_prefix_cache`` are passed
when this kvroute version has them, and left out otherwise (so the module imports, and
the probes they would fix show up as mismatches).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from router.index.base import IndexBackend
from router.ingest.ingestor import Ingestor
from router.score.scorer import Scorer
from schemas import KVEventBatch
from schemas.decode import DecodeStats, decode_batch

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vllm-conformance"
# Decoder counters that mean information was lost or refused.
DECODE_REJECTS = ("unknown_event_types", "unknown_fields", "malformed_events", "legacy_events")
# Ingest counters that mean an event (or some of its blocks) was rejected.
INGEST_REJECTS = (
    "bad_events",
    "unknown_parent",
    "unresolved_blocks",
    "bad_groups",
    "partial_unknown_prefix",
)


@dataclass
class Recording:
    name: str
    description: str
    vllm_version: str
    worker: dict[str, Any]
    groups: list[dict[str, Any]]
    steps: list[dict[str, Any]]

    @property
    def dp_ranks(self) -> int:
        return int(self.worker.get("dp_ranks", 1))

    @property
    def probes(self) -> list[dict[str, Any]]:
        return [s for s in self.steps if s["op"] == "probe"]


def recording_paths() -> list[Path]:
    return sorted(FIXTURES.glob("*.msgpack"))


def load(path: Path) -> Recording:
    raw = msgspec.msgpack.decode(path.read_bytes())
    if raw.get("format") != 1:
        raise ValueError(f"{path.name}: unknown recording format {raw.get('format')!r}")
    return Recording(
        name=raw["scenario"],
        description=raw["description"],
        vllm_version=raw["vllm_version"],
        worker=raw["worker"],
        groups=raw["groups"],
        steps=raw["steps"],
    )


def worker_id(rank: int) -> str:
    return f"vllm-dp{rank}"


class KvrouteUnderTest:
    """kvroute's ingest + score path over one index, with the recording's engine settings."""

    def __init__(self, index: IndexBackend) -> None:
        self.index = index
        self.ingestor = Ingestor(index)
        self.scorer = Scorer(index)
        self.decode_stats = DecodeStats()
        self.report_full = False
        params = inspect.signature(self.scorer.score_result).parameters
        self._score_has_skip = "skip_prefix_cache" in params

    async def configure(self, wid: str, worker: dict[str, Any]) -> None:
        """Register the engine settings vLLM's events do not carry, where supported."""
        configure = getattr(self.ingestor, "configure", None)
        try:
            from router.index.base import EngineSettings  # type: ignore[attr-defined]
        except ImportError:
            return
        if configure is None:
            return
        names = set(getattr(EngineSettings, "__struct_fields__", ()))
        wanted = {
            "hash_block_size": worker["hash_block_size"],
            "eagle": worker["eagle"],
            "partial_hash_hits": worker["partial_hash_hits"],
            "report_full": self.report_full,
        }
        await configure(wid, EngineSettings(**{k: v for k, v in wanted.items() if k in names}))

    async def feed(self, wid: str, payload: bytes) -> None:
        await self.ingestor.apply_batch(wid, decode_batch(payload, self.decode_stats))

    async def feed_many(self, frames: list[tuple[str, int, int, bytes]]) -> None:
        """Several frames (worker, rank, seq, payload) in one index write, merged per
        worker the way the subscriber's writer merges what it has received so far
        (``router.ingest.writer``): one batch, with a mark where each frame begins."""
        merged: dict[str, tuple[list[Any], list[tuple[int, int, int, int]]]] = {}
        for wid, rank, seq, payload in frames:
            events, marks = merged.setdefault(wid, ([], []))
            marks.append((len(events), rank, seq, 0))
            events += decode_batch(payload, self.decode_stats).events
        await self.ingestor.apply_batches(
            [(wid, KVEventBatch(0.0, events), marks) for wid, (events, marks) in merged.items()]
        )

    async def hit_tokens(self, wid: str, probe: dict[str, Any]) -> int:
        """kvroute's answer to vLLM's probe: the worker's ``hit_tokens``."""
        kwargs: dict[str, Any] = {
            "lora_name": probe["lora_name"],
            "cache_salt": probe["cache_salt"],
        }
        if self._score_has_skip:
            kwargs["skip_prefix_cache"] = probe["skip_prefix_cache"]
        result = await self.scorer.score_result(list(probe["token_ids"]), [wid], **kwargs)
        rows = [w for w in result.workers if w.worker_id == wid]
        return rows[0].hit_tokens if rows else 0

    def rejects(self) -> dict[str, int]:
        """Every reject counter that is not zero (decoder and ingest)."""
        counters = {**self.decode_stats.as_dict(), **self.ingestor.counters.as_dict()}
        return {k: counters[k] for k in DECODE_REJECTS + INGEST_REJECTS if counters.get(k)}


@dataclass
class Outcome:
    scenario: str
    exact: int = 0
    total: int = 0
    over: int = 0  # kvroute promised more than vLLM reuses
    under: int = 0
    mismatches: list[str] = field(default_factory=list)
    rejects: dict[str, int] = field(default_factory=dict)

    def line(self) -> str:
        return (
            f"{self.scenario:15s} exact {self.exact:4d}/{self.total:<4d} "
            f"(over {self.over}, under {self.under}) rejects {self.rejects or 0}"
        )


async def replay(
    rec: Recording, kv: KvrouteUnderTest, keep: int = 8, merged: bool = False
) -> Outcome:
    """Feed ``rec`` through ``kv``; compare at every probe. ``merged``: the frames
    between two probes go in one ``apply_batches`` call (what a live subscriber that
    fell behind does), else one call per frame."""
    # What the operator knows and registers: whether clients ask for full reports.
    kv.report_full = any(s["op"] == "action" and s["action"].get("report_full") for s in rec.steps)
    for rank in range(rec.dp_ranks):
        await kv.configure(worker_id(rank), rec.worker)
    out = Outcome(rec.name + (" (merged)" if merged else ""))
    backlog: list[tuple[str, int, int, bytes]] = []
    for step in rec.steps:
        op = step["op"]
        if op == "frame":
            if merged:
                rank = step["dp_rank"]
                backlog.append((worker_id(rank), rank, step["seq"], step["payload"]))
            else:
                await kv.feed(worker_id(step["dp_rank"]), step["payload"])
        elif op == "probe":
            if backlog:
                await kv.feed_many(backlog)
                backlog = []
            got = await kv.hit_tokens(worker_id(step["dp_rank"]), step)
            want = step["expected_hit_tokens"]
            out.total += 1
            if got == want:
                out.exact += 1
                continue
            if got > want:
                out.over += 1
            else:
                out.under += 1
            if len(out.mismatches) < keep:
                out.mismatches.append(
                    f"probe {out.total} ({step['request_id']}, rank {step['dp_rank']}, "
                    f"{len(step['token_ids'])} tokens, lora={step['lora_name']}, "
                    f"salt={step['cache_salt']}, skip={step['skip_prefix_cache']}): "
                    f"vLLM {want}, kvroute {got}"
                )
    if backlog:
        await kv.feed_many(backlog)
    out.rejects = kv.rejects()
    return out
