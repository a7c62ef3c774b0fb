"""The per-worker hit computation behind ``Scorer``: one worker's masks at a time.

Split from ``router.score.scorer`` (which builds rows and picks the path): the per-worker path
serves EAGLE workers, workers at another hash unit, the Redis backend and small fleets;
``router.score.vec`` does the same for many workers at once.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from router.index.base import GroupMeta
from schemas.hit_rule import group_max_hit, hit_step, longest_hit, max_candidate


class Plan:
    """What one group layout (a worker's tuple of ``GroupMeta``) needs, derived once per
    scorer instead of once per worker and request: the specs, the hit step and each
    group's (block size, rule, window blocks)."""

    __slots__ = ("fine", "metas", "shapes", "specs", "step")

    def __init__(self, metas: tuple[GroupMeta, ...]) -> None:
        self.metas = metas
        self.specs = [m.spec() for m in metas]
        self.step = hit_step(self.specs)
        self.shapes = [(s.block_size, s.rule, s.window_blocks) for s in self.specs]
        self.fine = any(s.rule == "fine" for s in self.specs)


def truncate(plan: Plan, lists: list[bytes]) -> list[bytes]:
    """Cut lists as ``WorkerSnapshot`` documents (exact for the rule, shorter scans):
    full-attention lists at their first miss, the others after their last hit and at
    the shortest full-attention prefix."""
    bound: int | None = None
    out = list(lists)
    for i, ((bs, rule, _), lst) in enumerate(zip(plan.shapes, lists, strict=True)):
        if rule == "full":
            z = lst.find(0)
            if z >= 0:
                out[i] = lst[:z]
            reach = len(out[i]) * bs
            bound = reach if bound is None else min(bound, reach)
    for i, ((bs, rule, _), lst) in enumerate(zip(plan.shapes, lists, strict=True)):
        if rule != "full":
            cut = lst if bound is None else lst[: bound // bs]
            out[i] = cut.rstrip(b"\0")
    return out


def tier(
    plan: Plan, lists: Sequence[bytes], n: int, memo: dict[object, Any], eagle: int | None = None
) -> tuple[int, list[int]]:
    """The joint hit and each group's own hit, for one tier.

    Each group's own maximum (``group_max_hit``) bounds the joint answer, so
    ``longest_hit`` starts its descent there: same answer, a much shorter scan. Group
    maxima are memoised per request: workers and tiers often share one group's list.
    """
    step = plan.step
    top = max_candidate(n, step)
    own = []
    for meta, spec, lst in zip(plan.metas, plan.specs, lists, strict=True):
        limit = min(top, (len(lst) * meta.block_size // step) * step)
        if limit <= 0:
            own.append(0)
            continue
        key = (meta, lst, limit, step)  # GroupMeta hashes in C, GroupSpec in Python
        got = memo.get(key)
        if got is None:
            got = memo[key] = group_max_hit(spec, lst, limit, step)
        own.append(got)
    if eagle is not None:  # the per-group maxima do not bound the EAGLE rule
        hit = longest_hit(n, plan.specs, lists, eagle=True, hash_block_size=eagle or None)
        return hit, own
    bound = min(own)
    if bound <= 0 or bound == max(own):
        return max(bound, 0), own  # every group accepts ``bound``: it is the answer
    if plan.fine:  # a fine-grained group's reach depends on the request's own cap
        return longest_hit(n, plan.specs, lists), own
    return longest_hit(bound + 1, plan.specs, lists), own
