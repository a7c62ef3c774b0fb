"""The score result as msgspec Structs, shared by the scorer's paths.

The same fields, order and defaults as ``schemas.rest``'s ``GroupScore`` /
``WorkerScore`` / ``ScoreResponse``, so ``msgspec.json.encode`` of a result is the JSON
of the validated pydantic model (tested) at a fraction of the cost -- /v1/score answers
with it; ``Scorer.score`` still returns the pydantic model. Split from
``router.score.scorer`` so every path (per worker, columns, bitsets) builds the same rows
without importing the scorer.
"""

from __future__ import annotations

import msgspec


class GroupRow(msgspec.Struct):
    group_idx: int
    kind: str | None = None
    block_size: int | None = None
    learned: bool = True
    hit_tokens: int = 0
    hit_tokens_gpu: int = 0


class WorkerRow(msgspec.Struct):
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
