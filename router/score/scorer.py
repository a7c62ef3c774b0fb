"""Read side: HMA-exact per-worker scores for a request (docs/design.md#hit-rule and #scoring).

Per request: hash the token ids once per distinct group block size, fetch every worker's
membership in one backend call, then per worker apply ``schemas.hit_rule`` twice --
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

from collections.abc import Callable, Sequence
from typing import Any

import msgspec

from router import native
from router.index.base import (
    CPU_BIT,
    DEFAULT_TIER_WEIGHTS,
    GPU_BIT,
    STORAGE_BIT,
    Bits,
    BlockKey,
    Columns,
    GroupMeta,
    IndexBackend,
    WorkerSnapshot,
)
from router.ingest.block_keys import request_keys
from router.ingest.placement import block_keys_at
from router.score.bits import cohort_rows
from router.score.partial_entries import PartialLookup
from router.score.rows import GroupRow, ScoreResult, WorkerRow, bulk_metas, sort_rows
from router.score.rule import Plan, tier, truncate
from router.score.vec import columns_rows
from schemas.rest import ScoreResponse

__all__ = ["GroupRow", "ScoreResult", "Scorer", "WorkerRow", "to_response"]

# Below this many workers the per-worker path is as fast (numpy's fixed cost per call
# outweighs the per-worker Python it saves; measured in benchmarks/router_core.py).
COLUMNS_MIN_WORKERS = 32
# From this many workers the bitset path (``router.score.bits``) is used. Measured in
# benchmarks/router_core.py (runs in docs/benchmarks.md): at 256 workers it costs
# 0.6-0.7x the columns path when every worker holds the prompt and 1.15-1.18x on the
# "typical" fleet (offloaded workers need per-worker counts); at 64 workers about the
# same all-hit and slower typical.
BITS_MIN_WORKERS = 128
# With the compiled core (router/native: C lookups with prefetching, labels and rows in
# C) the bitset path is the fastest from one worker on the one-group workload of
# benchmarks/dynamo_side_by_side.py (0.09 vs 0.2 ms at 8 workers) and within noise of
# the other paths on router_core.py's hybrid fleets (docs/benchmarks.md, round 3).
BITS_MIN_WORKERS_NATIVE = 1


_encoder = msgspec.json.Encoder()
# (hit_tokens, hit_tokens_gpu, per-group rows, score) of one membership pattern.
_Result = tuple[int, int, list[GroupRow], float]
# bytes.translate table: media bitmask -> GPU-only bitmask.
_GPU_ONLY = bytes((m & GPU_BIT) for m in range(256))
# bytes.translate table: media bitmask -> best tier (1 GPU, 2 CPU, 3 STORAGE, 0 none).
_BEST_TIER = bytes(
    1 if m & GPU_BIT else 2 if m & CPU_BIT else 3 if m & STORAGE_BIT else 0 for m in range(256)
)


def to_response(result: ScoreResult) -> ScoreResponse:
    """The pydantic model of a result (parsing the Structs' JSON in pydantic-core beats
    validating built-in objects)."""
    return ScoreResponse.model_validate_json(_encoder.encode(result))


class Scorer:
    """Scores requests against an index; holds no per-request state."""

    def __init__(
        self,
        index: IndexBackend,
        *,
        tier_weights: dict[str, float] | None = None,
        columns: bool = True,
        columns_min_workers: int = COLUMNS_MIN_WORKERS,
        bits: bool = True,
        bits_min_workers: int | None = None,
    ) -> None:
        self.index = index
        # False: always the per-worker path (benchmarks compare the paths in one run).
        self.columns = columns
        # False: the numpy columns path instead of bitsets (when the backend has both).
        self.bits = bits
        self.columns_min_workers = columns_min_workers
        # None: BITS_MIN_WORKERS_NATIVE on the compiled core, else BITS_MIN_WORKERS
        # (decided per score: tests switch cores within one process).
        self.bits_min_workers = bits_min_workers
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
        # Block sizes seen so far (and the hash unit last seen with each): hashed up
        # front so one fetch usually suffices.
        self._sizes: set[int] = set()
        self._units: dict[int, int] = {}
        self._plans: dict[tuple[GroupMeta, ...], Plan] = {}

    async def score(
        self,
        token_ids: list[int],
        worker_ids: list[str],
        *,
        lora_name: str | None = None,
        cache_salt: str | None = None,
    ) -> ScoreResponse:
        """The validated pydantic model (callers that read or dump the result)."""
        res = await self.score_result(
            token_ids, worker_ids, lora_name=lora_name, cache_salt=cache_salt
        )
        return to_response(res)

    async def score_result(
        self,
        token_ids: list[int],
        worker_ids: list[str],
        *,
        lora_name: str | None = None,
        cache_salt: str | None = None,
        skip_prefix_cache: bool = False,
    ) -> ScoreResult:
        """Rows best first, as Structs; ``msgspec.json.encode`` gives the API's answer.

        Keys are chained at each worker's hash unit (a group of block size ``k * unit``
        reads every ``k``-th unit key). One fetch asks with the unit last seen for each
        block size; workers whose unit or block sizes differ are asked again.
        """
        if skip_prefix_cache:  # vLLM reads no prefix cache for such requests
            return ScoreResult(
                len(token_ids), [WorkerRow(w, 0, 0, 0.0) for w in sorted(set(worker_ids))]
            )
        chains: dict[int, list[BlockKey]] = {}

        def keys_for(bs: int, unit: int | None) -> list[BlockKey]:
            u = unit if unit and bs % unit == 0 else bs
            units = chains.get(u)
            if units is None:
                units = chains[u] = request_keys(token_ids, u, lora_name, cache_salt)
            return block_keys_at(units, bs // u)

        used = {bs: self._units.get(bs) or bs for bs in self._sizes}
        keys: dict[int, Sequence[BlockKey]] = {bs: keys_for(bs, u) for bs, u in used.items()}
        n = len(token_ids)
        ids = list(dict.fromkeys(worker_ids))
        # vLLM partial entries ingest could not key, found by the engine's own hashing
        # (router.score.partial_entries): their workers take the per-worker path.
        if waiting := PartialLookup.open(self.index, ids, token_ids, lora_name, cache_salt):
            return _sorted(n, await self._via_snapshots(ids, keys, used, keys_for, n, waiting))
        bits_min = self.bits_min_workers
        if bits_min is None:
            bits_min = BITS_MIN_WORKERS if native.ACTIVE == "python" else BITS_MIN_WORKERS_NATIVE
        use_bits = self.columns and self.bits and len(ids) >= bits_min
        bits = await self.index.fetch_bits(ids) if use_bits else None
        if bits is not None:
            # One cohort and nothing else: its rows come out best first already.
            ordered = len(bits.cohorts) == 1 and not bits.unknown
            rows, rest = self._via_bits(bits, keys, used, n, ordered)
            if rest:
                rows += await self._via_snapshots(rest, keys, used, keys_for, n)
            elif ordered:
                return ScoreResult(n, rows)
            return _sorted(n, rows)
        wide = self.columns and len(ids) >= self.columns_min_workers
        cols = await self.index.fetch_columns(ids, keys) if wide else None
        if cols is None:
            rows = await self._via_snapshots(ids, keys, used, keys_for, n)
        else:
            rows, rest = self._via_columns(cols, used, n)
            if rest:  # EAGLE, unknown groups, another hash unit: the per-worker path
                rows += await self._via_snapshots(rest, keys, used, keys_for, n)
        return _sorted(n, rows)

    def _via_bits(
        self,
        bits: Bits,
        keys: dict[int, Sequence[BlockKey]],
        used: dict[int, int],
        n: int,
        ordered: bool = False,
    ) -> tuple[list[WorkerRow], list[str]]:
        """Rows computed per cohort on presence bitsets (``router.score.bits``), and the
        workers that need ``_via_snapshots`` instead (as ``_via_columns`` decides).
        ``ordered``: each cohort's rows best first (``sort_rows``)."""
        out: list[WorkerRow] = [WorkerRow(w, 0, 0, 0.0, False) for w in bits.unknown]
        rest: list[str] = []
        masks = bits.masks or [0] * len(bits.cohorts)
        for (snap, members), mask in zip(bits.cohorts, masks, strict=True):
            groups = snap.groups
            if not groups:
                out += [WorkerRow(w, 0, 0, 0.0, False) for w, _ in members]
                continue
            metas = bulk_metas(snap, used, lambda _, m: m.block_size in keys)
            if metas is None:
                rest += [w for w, _ in members]
                continue
            plan = self._plan(metas)
            group_keys = [keys[m.block_size] for m in metas]
            out += cohort_rows(
                plan, metas, members, bits, group_keys, n, self._weight, ordered, mask
            )
        return out, rest

    async def _via_snapshots(
        self,
        ids: list[str],
        keys: dict[int, Sequence[BlockKey]],
        used: dict[int, int],
        keys_for: Callable[[int, int | None], list[BlockKey]],
        n: int,
        waiting: PartialLookup | None = None,
    ) -> list[WorkerRow]:
        """Rows of ``ids`` (in order) from per-worker snapshots (``fetch``); ``waiting``:
        partial entries to add to them (``router.score.partial_entries``)."""
        snaps = await self.index.fetch(ids, keys)
        again: dict[int | None, list[str]] = {}
        for wid, snap in snaps.items():
            if snap is None:
                continue
            unit = snap.hash_unit
            for g, m in snap.groups.items():
                if g not in snap.masks or used.get(m.block_size) != (unit or m.block_size):
                    again.setdefault(unit, []).append(wid)
                    break
        for unit, wids in again.items():
            sizes = {m.block_size for w in wids for m in snaps[w].groups.values()}  # type: ignore[union-attr]
            for bs in sizes:
                self._sizes.add(bs)
                self._units[bs] = unit or bs
            snaps.update(await self.index.fetch(wids, {bs: keys_for(bs, unit) for bs in sizes}))
        if waiting is not None:
            waiting.apply(snaps)
        memo: dict[object, Any] = {}
        return [self._worker(wid, snaps.get(wid), n, memo) for wid in ids]

    def _via_columns(
        self, cols: Columns, used: dict[int, int], n: int
    ) -> tuple[list[WorkerRow], list[str]]:
        """The numpy columns path (``router.score.vec.columns_rows``)."""
        return columns_rows(cols, used, n, self._weight, self._plan, self._weighted)

    def _plan(self, metas: tuple[GroupMeta, ...]) -> Plan:
        plan = self._plans.get(metas)
        if plan is None:
            if len(self._plans) >= 1024:  # group layouts are few; never grow unbounded
                self._plans.clear()
            plan = self._plans[metas] = Plan(metas)
        return plan

    def _worker(
        self, worker_id: str, snap: WorkerSnapshot | None, n: int, memo: dict[object, Any]
    ) -> WorkerRow:
        """One worker's row; workers with identical patterns share one computation."""
        if snap is None or not snap.groups:
            return WorkerRow(worker_id, 0, 0, 0.0, False)
        groups = snap.groups
        order = sorted(groups)
        if len(order) != order[-1] + 1:
            # A group index below a learned one never announced itself: its blocks and
            # kind are unknown, so any hit would be a guess.
            return WorkerRow(worker_id, 0, 0, 0.0, False, _gapped_rows(groups, order))
        metas = tuple(groups[g] for g in order)
        masks = snap.masks
        any_lists = tuple(masks.get(g, b"") for g in order)
        # EAGLE/MTP changes the rule (vLLM drops the last matched block); the hash unit
        # bounds its peek block. None: the plain rule.
        eagle = (snap.hash_unit or 0) if snap.settings.eagle else None
        memo_key = (metas, any_lists, eagle)
        done = memo.get(memo_key)
        if done is None:
            done = memo[memo_key] = self._compute(metas, any_lists, n, memo, eagle)
        hit, hit_gpu, group_rows, score = done
        # A copy per worker: rows never share a mutable list.
        return WorkerRow(worker_id, hit, hit_gpu, score, True, list(group_rows))

    def _compute(
        self,
        metas: tuple[GroupMeta, ...],
        any_lists: Sequence[bytes],
        n: int,
        memo: dict[object, Any],
        eagle: int | None = None,
    ) -> _Result:
        """(hit_tokens, hit_tokens_gpu, per-group rows, score) for one pattern."""
        plan = self._plan(metas)
        hit, own = tier(plan, any_lists, n, memo, eagle)
        gpu_lists = [lst.translate(_GPU_ONLY) for lst in any_lists]
        if gpu_lists == list(any_lists):
            hit_gpu, own_gpu = hit, own
        else:
            hit_gpu, own_gpu = tier(plan, truncate(plan, gpu_lists), n, memo, eagle)
        score = max(self._weighted(hit, plan, any_lists), float(hit_gpu) * self._weight[GPU_BIT])
        rows = [
            GroupRow(g, m.kind, m.block_size, True, h, hg)
            for g, (m, h, hg) in enumerate(zip(metas, own, own_gpu, strict=True))
        ]
        return hit, hit_gpu, rows, round(score, 3)

    def _weighted(self, p: int, plan: Plan, lists: Sequence[bytes]) -> float:
        """``p`` times the mean tier weight of every block the hit needs (see module doc).

        The mean is taken from counts per best tier (``n_gpu * w_gpu + n_cpu * w_cpu +
        n_storage * w_storage``): the same float operations whatever the block order,
        so the all-workers path (``scoring_vec.tier_counts``) gives the identical float.
        """
        if p <= 0:
            return 0.0
        n_gpu = n_cpu = n_sto = count = 0
        for (bs, rule, window_blocks), lst in zip(plan.shapes, lists, strict=True):
            end = p // bs
            start = (
                0
                if rule == "full"
                else max(0, end - window_blocks)
                if rule == "sliding"
                else end - 1
            )
            tiers = lst[start:end].translate(_BEST_TIER)
            n_gpu += tiers.count(1)
            n_cpu += tiers.count(2)
            n_sto += tiers.count(3)
            count += end - start
        w = self._weight
        total = n_gpu * w[GPU_BIT] + n_cpu * w[CPU_BIT] + n_sto * w[STORAGE_BIT]
        return p * total / count if count else float(p)


def _sorted(n: int, rows: list[WorkerRow]) -> ScoreResult:
    """Best first: score, then hit tokens, then worker id."""
    return ScoreResult(n, sort_rows(rows))


def _gapped_rows(groups: dict[int, GroupMeta], order: list[int]) -> list[GroupRow]:
    """The rows of a worker whose group indices have gaps: each learned group, and one
    ``learned: false`` row where each gap starts (its first index never announced itself).
    As many rows as groups, whatever the indices: a row per index up to the largest made
    one event naming group ``2**64 - 1`` cost every score gigabytes and seconds."""
    rows: list[GroupRow] = []
    expected = 0
    for g in order:
        if g > expected:
            rows.append(GroupRow(expected, learned=False))
        meta = groups[g]
        rows.append(GroupRow(g, meta.kind, meta.block_size))
        expected = g + 1
    return rows
