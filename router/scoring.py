"""Read side: HMA-exact per-worker scores for a request (DESIGN §3, §4).

Per request: hash the token ids once per distinct group block size, fetch every worker's
membership in one backend call, then per worker apply ``offload_core.hit_rule`` twice --
over blocks on any tier (``hit_tokens``) and over GPU blocks only (``hit_tokens_gpu``).

Score (tier-weighted tokens). For a hit of ``p`` tokens, each group needs some blocks
ending at ``p``: every block for full attention, the last ``window_blocks`` for a
sliding window, the last one for mamba. Each needed block is weighted by the best tier
holding it (GPU 1.0, CPU 0.8, STORAGE 0.5 by default) and

    weighted(p) = p * mean(weight of every needed block, over all groups)
    score       = max(weighted(hit_tokens), weighted(hit_tokens_gpu))

so an all-GPU hit scores its token count and offloaded blocks cost in proportion.

Hit lists are truncated by the backend (see ``WorkerSnapshot``) and the request length
given to ``longest_hit`` is capped at the longest aligned position the lists can reach,
which changes no answer but makes a worker's cost proportional to what it holds.
"""

from __future__ import annotations

from collections.abc import Sequence

from offload_core.hit_rule import (
    GroupSpec,
    group_max_hit,
    hit_step,
    longest_hit,
    max_candidate,
)
from router.hash_modes import request_keys
from router.index.base import (
    CPU_BIT,
    GPU_BIT,
    STORAGE_BIT,
    BlockKey,
    GroupMeta,
    IndexBackend,
    WorkerSnapshot,
)
from schemas.rest import GroupScore, ScoreResponse, WorkerScore

DEFAULT_TIER_WEIGHTS: dict[str, float] = {"GPU": 1.0, "CPU": 0.8, "STORAGE": 0.5}
# bytes.translate table: media bitmask -> GPU-only bitmask.
_GPU_ONLY = bytes((m & GPU_BIT) for m in range(256))


class Scorer:
    """Scores requests against an index; holds no per-request state."""

    def __init__(
        self, index: IndexBackend, *, tier_weights: dict[str, float] | None = None
    ) -> None:
        self.index = index
        self.tier_weights = {**DEFAULT_TIER_WEIGHTS, **(tier_weights or {})}
        w = self.tier_weights
        # Weight of a block by its media bitmask: the best tier holding it.
        self._weight = [
            w["GPU"]
            if m & GPU_BIT
            else w["CPU"]
            if m & CPU_BIT
            else w["STORAGE"]
            if m & STORAGE_BIT
            else 0.0
            for m in range(256)
        ]
        # Block sizes seen so far: hashed up front so one fetch usually suffices.
        self._sizes: set[int] = set()

    async def score(
        self,
        token_ids: list[int],
        worker_ids: list[str],
        *,
        lora_name: str | None = None,
        cache_salt: str | None = None,
    ) -> ScoreResponse:
        keys: dict[int, Sequence[BlockKey]] = {
            bs: request_keys(token_ids, bs, lora_name, cache_salt) for bs in self._sizes
        }
        snaps = await self.index.fetch(worker_ids, keys)
        missing = {
            m.block_size
            for s in snaps.values()
            if s is not None
            for g, m in s.groups.items()
            if g not in s.masks
        }
        if missing:  # a block size never seen by this scorer: hash it and ask again
            self._sizes |= missing
            for bs in missing:
                keys[bs] = request_keys(token_ids, bs, lora_name, cache_salt)
            again = [w for w, s in snaps.items() if s is not None and len(s.masks) < len(s.groups)]
            snaps.update(await self.index.fetch(again, keys))
        n = len(token_ids)
        scores = [self._worker(wid, snaps.get(wid), n) for wid in dict.fromkeys(worker_ids)]
        scores.sort(key=lambda s: (-s.score, -s.hit_tokens, s.worker_id))
        return ScoreResponse(request_tokens=n, workers=scores)

    def _worker(self, worker_id: str, snap: WorkerSnapshot | None, n: int) -> WorkerScore:
        if snap is None or not snap.groups:
            return WorkerScore(
                worker_id=worker_id, hit_tokens=0, hit_tokens_gpu=0, score=0.0, learned=False
            )
        order = sorted(snap.groups)
        unlearned = [g for g in range(order[-1] + 1) if g not in snap.groups]
        if unlearned:
            # A group index below a learned one never announced itself: its blocks and
            # kind are unknown, so any hit would be a guess.
            groups = [
                _group_score(g, snap.groups.get(g), learned=g not in unlearned)
                for g in range(order[-1] + 1)
            ]
            return WorkerScore(
                worker_id=worker_id,
                hit_tokens=0,
                hit_tokens_gpu=0,
                score=0.0,
                learned=False,
                groups=groups,
            )
        metas = [snap.groups[g] for g in order]
        specs = [m.spec() for m in metas]
        any_lists = [snap.masks.get(g, b"") for g in order]
        step = hit_step(specs)
        reach = min(len(lst) * m.block_size for lst, m in zip(any_lists, metas, strict=True))
        limit = min(max_candidate(n, step), (reach // step) * step)
        hit = longest_hit(limit + 1, specs, any_lists) if limit > 0 else 0
        if all(lst.translate(_GPU_ONLY) == lst for lst in any_lists):
            gpu_lists = any_lists
            hit_gpu = hit
        else:
            gpu_lists = [lst.translate(_GPU_ONLY) for lst in any_lists]
            hit_gpu = longest_hit(limit + 1, specs, gpu_lists) if limit > 0 else 0
        groups = []
        for g, m, spec, la, lg in zip(order, metas, specs, any_lists, gpu_lists, strict=True):
            own = min(max_candidate(n, step), (len(la) * m.block_size // step) * step)
            gs = _group_score(g, m, learned=True)
            gs.hit_tokens = group_max_hit(spec, la, own, step) if own > 0 else 0
            gs.hit_tokens_gpu = (
                gs.hit_tokens if lg is la else group_max_hit(spec, lg, own, step) if own > 0 else 0
            )
            groups.append(gs)
        score = max(self._weighted(hit, specs, any_lists), float(hit_gpu) * self._weight[GPU_BIT])
        return WorkerScore(
            worker_id=worker_id,
            hit_tokens=hit,
            hit_tokens_gpu=hit_gpu,
            score=round(score, 3),
            groups=groups,
        )

    def _weighted(self, p: int, specs: Sequence[GroupSpec], lists: Sequence[bytes]) -> float:
        """``p`` times the mean tier weight of every block the hit needs (see module doc)."""
        if p <= 0:
            return 0.0
        total = 0.0
        count = 0
        weight = self._weight
        for spec, lst in zip(specs, lists, strict=True):
            end = p // spec.block_size
            rule = spec.rule
            start = (
                0
                if rule == "full"
                else max(0, end - spec.window_blocks)
                if rule == "sliding"
                else end - 1
            )
            needed = lst[start:end]
            total += sum(map(weight.__getitem__, needed))
            count += len(needed)
        return p * total / count if count else float(p)


def _group_score(g: int, meta: GroupMeta | None, *, learned: bool) -> GroupScore:
    if meta is None:
        return GroupScore(group_idx=g, learned=False)
    return GroupScore(group_idx=g, kind=meta.kind, block_size=meta.block_size, learned=learned)
