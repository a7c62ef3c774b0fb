"""The score result as msgspec Structs, shared by the scorer's paths.

Rows are not tracked by the garbage collector (``gc=False``: they hold scalars and a
list of GroupRows, never a cycle), so a score's hundreds of rows do not trigger
collections. The same fields, order and defaults as ``schemas.rest``'s ``GroupScore`` /
``WorkerScore`` / ``ScoreResponse``, so ``msgspec.json.encode`` of a result is the JSON
of the validated pydantic model (tested) at a fraction of the cost -- /v1/score answers
with it; ``Scorer.score`` still returns the pydantic model. Split from
``router.score.scorer`` so every path (per worker, columns, bitsets) builds the same rows
without importing the scorer, and so do they decide alike which cohorts they can take
(``bulk_metas``).
"""

from __future__ import annotations

from collections.abc import Callable
from operator import attrgetter

import msgspec

from router.index.base import GroupMeta, WorkerSnapshot


class GroupRow(msgspec.Struct, gc=False):
    group_idx: int
    kind: str | None = None
    block_size: int | None = None
    learned: bool = True
    hit_tokens: int = 0
    hit_tokens_gpu: int = 0


class WorkerRow(msgspec.Struct, gc=False):
    worker_id: str
    hit_tokens: int
    hit_tokens_gpu: int
    score: float
    learned: bool = True
    groups: list[GroupRow] = msgspec.field(default_factory=list)
    # The worker's history was rebuilt only in part (its replay buffer did not reach
    # back far enough): blocks from before may be missing, so hits can only be higher.
    lower_bound: bool = False


class ScoreResult(msgspec.Struct):
    request_tokens: int
    workers: list[WorkerRow]


def bulk_metas(
    snap: WorkerSnapshot, used: dict[int, int], readable: Callable[[int, GroupMeta], bool]
) -> tuple[GroupMeta, ...] | None:
    """A cohort's group metadata in group order when the bulk paths (numpy columns,
    bitsets) can score it, else None: gapped group indices, EAGLE, partial-hash hits
    (groups indexed per hash unit) and keys chained at another unit take the per-worker
    path, which applies those rules exactly. ``readable(g, meta)``: the group's keys
    were fetched for this request."""
    groups = snap.groups
    metas = tuple(groups[g] for g in range(len(groups)) if g in groups)
    unit = snap.hash_unit
    if (
        len(metas) != len(groups)
        or snap.settings.eagle
        or any(m.block_units > 1 for m in metas)
        or any(
            used.get(m.block_size) != (unit or m.block_size) or not readable(g, m)
            for g, m in enumerate(metas)
        )
    ):
        return None
    return metas


_BY_ID = attrgetter("worker_id")
_BY_HIT = attrgetter("hit_tokens")
_BY_SCORE = attrgetter("score")


def sort_rows(rows: list[WorkerRow]) -> list[WorkerRow]:
    """Best first, in place: score, then hit tokens, then worker id (stable sorts, keys
    in C)."""
    rows.sort(key=_BY_ID)
    rows.sort(key=_BY_HIT, reverse=True)
    rows.sort(key=_BY_SCORE, reverse=True)
    return rows
