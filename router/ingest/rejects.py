"""Which KV events ingest rejects, and how each rejection is counted and logged.

Why its own module: a rejected event must change nothing. The ingestor used to learn a
store's group metadata and the worker's hash unit *before* finding the store bad, so one
bad store could rewrite a group's block size for good (a ``2**40``-token block: every
chain scored 0 from then on), register a group index no engine has (the worker then
reported ``learned: false`` for ever) or shrink the hash unit (wiping the worker's
entries). ``screen`` now decides on every store of a batch up front, from the event
alone, and puts a ``Rejected`` in its place: learning (``router.ingest.learning``),
parent lookups and keying (``router.ingest.key_planner``) never see it. The bounds live
here, next to the checks that apply them (docs/security.md lists them), and so does the
log policy: one rate-limit key per *kind* of fault -- never per value, or a stream of
distinct bad values would log every event -- and any value echoed is cut to
``ECHO_CHARS`` characters (a 4 MiB medium name must not become a 4 MiB log line).
"""

from __future__ import annotations

import logging
import reprlib
from dataclasses import dataclass
from typing import Any

from router.index.base import MEDIUM_BITS
from router.ingest.counters import IngestCounters
from router.ingest.learning import block_size
from router.logging_setup import event_extra
from router.ratelimited_log import RateLimitedLog
from schemas import BlockStored, KVEventBatch, normalise_medium

# KV cache groups per engine. vLLM puts every layer of a model into one group per kind
# of KV cache spec, splitting a kind into groups of equal layer count for hybrid models
# (``kv_cache_utils``), so a model has at most as many groups as KV-cache layers: a few
# in practice (1 for plain models, 2-6 for sliding-window / mamba hybrids), and even
# one group per layer stays under 256 for the deepest public models (~126 layers).
# ``group_idx`` 0..255 is accepted; beyond it is a fault (``bad_groups``): the scorer's
# work is per group, and no engine sends such an index.
MAX_GROUPS = 256
# Tokens per block. vLLM's ``--block-size`` choices go up to 256; decode context
# parallelism multiplies it (x8: 2048) and hybrid mamba models align the attention
# block to the mamba state's page (a few thousand tokens). 2**20 (1,048,576) leaves
# that 500x headroom and is longer than nearly every context served (a block only
# enters the prefix cache once full); beyond it a size is garbage (a rejected store
# once made a group's block 2**40 tokens long, and every score of that worker 0).
MAX_BLOCK_SIZE = 1 << 20
# Characters of a bad value echoed into a log line.
ECHO_CHARS = 80

# The kinds of fault: each is one rate-limit key.
BAD_GROUP = "invalid group_idx"
BAD_MEDIUM = "unknown medium"
BAD_SIZE = "invalid block_size"
NOT_A_MULTIPLE = "block_size is not a multiple of the registered hash unit"
BAD_TOKENS = "token_ids length does not fit block_hashes and block_size"
OTHER = "other"
KINDS = (BAD_GROUP, BAD_MEDIUM, BAD_SIZE, NOT_A_MULTIPLE, BAD_TOKENS)

_NO_VALUE: Any = object()
_repr = reprlib.Repr()
_repr.maxstring = _repr.maxother = _repr.maxlong = ECHO_CHARS
_repr.maxlevel = 2


def echo(value: object) -> str:
    """``repr(value)``, at most ``ECHO_CHARS`` characters (strings are cut before the
    repr is built)."""
    text = _repr.repr(value)
    return text if len(text) <= ECHO_CHARS else text[: ECHO_CHARS - 3] + "..."


def group_ok(group_idx: object) -> bool:
    """An index an engine sends: absent (group 0) or an int in ``[0, MAX_GROUPS)``."""
    if group_idx is None:
        return True
    return type(group_idx) is int and 0 <= group_idx < MAX_GROUPS


@dataclass(frozen=True, slots=True)
class Rejected:
    """A store ``screen`` rejected, in its place in the batch: no learner or planner
    reads it (they take ``BlockStored`` only); the ingestor counts it."""

    event: BlockStored
    kind: str
    value: object


def store_fault(
    ev: BlockStored, default_block_size: int | None, unit: int | None
) -> tuple[str, object] | None:
    """Why a store is rejected -- (kind, offending value) -- or None. ``unit``: the
    registered hash unit (a learned one is the gcd of the accepted sizes: every accepted
    size is a multiple of it). Exactly the checks the planner would fail it on
    (``KeyPlanner._keys``), decided before anything is learned from the batch."""
    if not group_ok(ev.group_idx):
        return BAD_GROUP, ev.group_idx
    if MEDIUM_BITS.get(normalise_medium(ev.medium) or "") is None:
        return BAD_MEDIUM, ev.medium
    size = block_size(ev.block_size) or default_block_size
    if size is None or size > MAX_BLOCK_SIZE:
        return BAD_SIZE, ev.block_size
    if unit and size % unit:
        return NOT_A_MULTIPLE, _Text(f"({size}, unit {unit})")
    n, tokens = len(ev.block_hashes), len(ev.token_ids)
    if n and tokens and (tokens % size or tokens < n * size):
        return BAD_TOKENS, _Text(f"({tokens} tokens, {n} blocks of {size})")
    return None


def screen(batch: KVEventBatch, default_block_size: int | None, unit: int | None) -> KVEventBatch:
    """``batch`` with each store ``store_fault`` rejects replaced by a ``Rejected``
    (the same batch when none is)."""
    events: list[Any] = batch.events
    out: list[Any] | None = None
    for i, ev in enumerate(events):
        if isinstance(ev, BlockStored) and (fault := store_fault(ev, default_block_size, unit)):
            if out is None:
                out = list(events)
            out[i] = Rejected(ev, *fault)
    return batch if out is None else KVEventBatch(batch.ts, out, batch.data_parallel_rank)


class BadEvents:
    """Counts bad events (``bad_events``, ``bad_groups``) and logs them rate-limited:
    the first 5 per kind of fault, then one line a minute with the suppressed count."""

    def __init__(self, counters: IngestCounters, logger: logging.Logger) -> None:
        self.counters = counters
        self._limited = RateLimitedLog(logger)

    def bad(self, kind: str, value: object = _NO_VALUE) -> None:
        """Count and log one bad event. ``kind`` is one of ``KINDS``; a free-text reason
        (the planner's, the fast path's ``"unknown medium 'X'"``) is split into its kind
        and the rest, so the key stays one per kind."""
        if value is _NO_VALUE:
            kind, value = _split(kind)
        self.counters.bad_events += 1
        if kind == BAD_GROUP:
            self.counters.bad_groups += 1
        self._limited.warning(
            ("bad_event", kind),
            "skipping bad KV event: %s %s (%d bad events so far)",
            kind,
            value if type(value) is _Text else echo(value),
            self.counters.bad_events,
            extra=event_extra("bad_event"),
        )

    def group(self, group_idx: object) -> int | None:
        """The event's group (absent = 0), or None (counted) for a value no engine sends."""
        if group_ok(group_idx):
            return group_idx if isinstance(group_idx, int) else 0  # absent: group 0
        self.bad(BAD_GROUP, group_idx)
        return None

    def reject(self, r: Rejected) -> None:
        self.bad(r.kind, r.value)


class _Text(str):
    """Already formatted text (a free-text reason's rest), logged as it is."""


def _split(why: str) -> tuple[str, _Text]:
    for kind in KINDS:
        if why.startswith(kind):
            return kind, _Text(why[len(kind) :].strip()[:ECHO_CHARS])
    return OTHER, _Text(why[:ECHO_CHARS])
