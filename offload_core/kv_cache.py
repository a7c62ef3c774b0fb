"""The KV cache manager: hybrid (HMA) cache hits and per-request block tables.

A request goes through four calls, so that the engine can move data in between:

1. ``begin`` finds the longest hit (docs/design.md#hit-rule, ``hit_rule.longest_hit``) over
   blocks on the GPU pool *or* a lower tier (e.g. CPU offload), takes references on the GPU
   blocks it reuses, and lists the blocks still to allocate -- some of which will be
   loaded back from the lower tier;
2. ``allocate`` gives those a slot (possibly evicting; the engine first offloads
   ``pool.eviction_candidates(plan.num_new_blocks)``);
3. ``commit`` caches the loaded and newly computed full blocks (``BlockStored``) and
   frees sliding-window blocks that fell out of the window (they stay cached);
4. ``finish`` frees the rest, tail first.

What each group holds while a request runs (block ``i`` covers tokens ``[i*b, (i+1)*b)``,
``p`` is the hit, ``n`` the prompt length):

* full attention: every block ``0 .. ceil(n/b)-1``;
* sliding window: blocks from the window ending at ``p`` up to the last one; older
  blocks are not needed (vLLM's null blocks);
* mamba: the state block at ``p`` (when ``p > 0``) plus one running-state block. The
  running state is cached as the checkpoint at the last block boundary of the prompt,
  ``floor(n/b)*b`` -- the one state vLLM keeps when a prompt is prefilled in one step.
  Intermediate boundaries are not checkpointed.

A full block beyond the hit that is already cached on GPU is reused rather than cached a
second time, so the published events always describe a set. Pure Python, no torch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from offload_core.base import OffloadKey, make_offload_key
from offload_core.block_pool import BlockPool
from schemas.hashing import block_extra_keys, block_hashes
from schemas.hit_rule import GroupSpec, hit_step, longest_hit, max_candidate

# "Is this (group, hash) block loadable from a lower tier right now?"
LowerTierLookup = Callable[[OffloadKey], bool]


def request_lora(lora_name: str | None) -> tuple[str, str] | None:
    """The (name, path) pair hashed for a LoRA request; a router scoring ``lora_name``
    must use the same. Simulated adapters have no path, so it is ``lora://<name>``.

    Not ``(name, name)``: pickle memoises a repeated *object*, so the digest would depend
    on whether the two strings are one object or two equal ones -- and a consumer
    re-hashing from decoded events always has two.
    """
    return None if lora_name is None else (lora_name, f"lora://{lora_name}")


class RequestTooLargeError(ValueError):
    """The prompt needs more blocks at once than the pool has."""


@dataclass(slots=True)
class Request:
    """A prompt and its block hashes, computed once per distinct block size."""

    token_ids: Sequence[int]
    hashes: dict[int, list[bytes]]
    cache_salt: str | None = None
    lora_name: str | None = None


@dataclass(slots=True)
class CacheHit:
    """``hit_tokens`` counts blocks on any tier; ``gpu_hit_tokens`` GPU blocks only."""

    hit_tokens: int
    gpu_hit_tokens: int
    on_gpu: list[list[bool]]
    cached: list[list[bool]]


@dataclass(slots=True)
class GroupPlan:
    """One group's blocks for one request (block index -> block id)."""

    group_idx: int
    spec: GroupSpec
    digests: list[bytes]
    blocks: dict[int, int] = field(default_factory=dict)
    # Indices still to allocate -> lower-tier key to load from (None: the engine computes it).
    pending: dict[int, OffloadKey | None] = field(default_factory=dict)
    # Indices this request fills and must cache (loaded blocks and computed full blocks).
    to_cache: list[int] = field(default_factory=list)


@dataclass(slots=True)
class RequestPlan:
    request: Request
    hit: CacheHit
    groups: list[GroupPlan]
    state: str = "begun"

    @property
    def hit_tokens(self) -> int:
        return self.hit.hit_tokens

    @property
    def num_new_blocks(self) -> int:
        return sum(len(g.pending) for g in self.groups)

    def loads(self) -> list[tuple[OffloadKey, int]]:
        """``(key, gpu block id)`` of every block to load back from the lower tier."""
        return [
            (key, gp.blocks[i])
            for gp in self.groups
            for i, key in gp.pending.items()
            if key is not None
        ]

    def computed(self) -> list[tuple[int, int, bytes]]:
        """``(group, gpu block id, digest)`` of every block the engine computes and caches."""
        return [
            (gp.group_idx, gp.blocks[i], gp.digests[i])
            for gp in self.groups
            for i in gp.to_cache
            if i in gp.pending and gp.pending[i] is None
        ]


class KVCacheManager:
    """Hybrid prefix cache over one ``BlockPool`` shared by every group."""

    def __init__(
        self,
        groups: Sequence[GroupSpec],
        num_blocks: int,
        hash_algo: str = "sha256",
        hash_seed: str | None = None,
        enable_events: bool = True,
    ) -> None:
        if not groups:
            raise ValueError("at least one KV cache group is required")
        self.groups = list(groups)
        self.hash_algo = hash_algo
        self.hash_seed = hash_seed
        self.step = hit_step(self.groups)
        self.pool = BlockPool(num_blocks, self.groups, enable_events=enable_events)

    # ------------------------------------------------------------------ hashing
    def make_request(
        self,
        token_ids: Sequence[int],
        cache_salt: str | None = None,
        lora_name: str | None = None,
    ) -> Request:
        lora = request_lora(lora_name)
        hashes = {
            size: block_hashes(
                token_ids, size, self.hash_algo, cache_salt, lora, seed=self.hash_seed
            )
            for size in {g.block_size for g in self.groups}
        }
        return Request(token_ids, hashes, cache_salt, lora_name)

    # --------------------------------------------------------------------- hits
    def find_longest_cache_hit(
        self, request: Request | Sequence[int], lower: LowerTierLookup | None = None
    ) -> CacheHit:
        """The hit rule (docs/design.md#hit-rule) over GPU blocks plus ``lower``-tier blocks
        (loaded back on a hit)."""
        if not isinstance(request, Request):
            request = self.make_request(request)
        n = len(request.token_ids)
        limit = max_candidate(n, self.step)
        on_gpu: list[list[bool]] = []
        cached: list[list[bool]] = []
        pool = self.pool
        for g, spec in enumerate(self.groups):
            digests = request.hashes[spec.block_size][: limit // spec.block_size]
            gpu_flags = [make_offload_key(d, g) in pool for d in digests]
            on_gpu.append(gpu_flags)
            if lower is None:
                cached.append(gpu_flags)
            else:
                cached.append(
                    [
                        hit or lower(make_offload_key(d, g))
                        for hit, d in zip(gpu_flags, digests, strict=True)
                    ]
                )
        hit = longest_hit(n, self.groups, cached)
        gpu_hit = hit if lower is None else longest_hit(n, self.groups, on_gpu)
        return CacheHit(hit, gpu_hit, on_gpu, cached)

    # ------------------------------------------------------------ request steps
    def begin(
        self, request: Request | Sequence[int], lower: LowerTierLookup | None = None
    ) -> RequestPlan:
        """Find the hit and reference the GPU blocks reused (raises RequestTooLargeError
        without touching anything when the prompt cannot fit in the pool)."""
        if not isinstance(request, Request):
            request = self.make_request(request)
        hit = self.find_longest_cache_hit(request, lower)
        plans = [self._plan_group(g, spec, request, hit) for g, spec in enumerate(self.groups)]
        held = [bid for gp in plans for bid in gp.blocks.values()]
        needed = len(held) + sum(len(gp.pending) for gp in plans)
        if needed > self.pool.num_blocks:
            raise RequestTooLargeError(
                f"prompt of {len(request.token_ids)} tokens needs {needed} blocks; "
                f"the pool has {self.pool.num_blocks}"
            )
        self.pool.touch(held)
        plan = RequestPlan(request, hit, plans)
        if plan.num_new_blocks > self.pool.num_free_blocks:
            self.pool.free(reversed(held))
            raise RequestTooLargeError(
                f"{plan.num_new_blocks} new blocks needed, {self.pool.num_free_blocks} free"
            )
        return plan

    def allocate(self, plan: RequestPlan) -> None:
        """Give every pending block a slot (evicting the least recently freed)."""
        self._advance(plan, "begun", "allocated")
        new_ids = iter(self.pool.allocate(plan.num_new_blocks))
        for gp in plan.groups:
            for i in gp.pending:
                gp.blocks[i] = next(new_ids)

    def commit(self, plan: RequestPlan) -> None:
        """Cache what the request filled; free sliding-window blocks out of the window."""
        self._advance(plan, "allocated", "committed")
        req = plan.request
        for gp in plan.groups:
            self._cache_group(gp, req)
            if gp.spec.rule == "sliding":
                assert gp.spec.sliding_window is not None
                n = len(req.token_ids)
                first_needed = max(0, n - gp.spec.sliding_window + 1) // gp.spec.block_size
                old = [i for i in gp.blocks if i < first_needed]
                self.pool.free(gp.blocks.pop(i) for i in sorted(old, reverse=True))

    def finish(self, plan: RequestPlan) -> None:
        """Release the request's blocks, group by group, each group's tail first."""
        self._advance(plan, "committed", "finished")
        for gp in plan.groups:
            self.pool.free(gp.blocks[i] for i in sorted(gp.blocks, reverse=True))
            gp.blocks.clear()

    def process(
        self,
        token_ids: Sequence[int],
        cache_salt: str | None = None,
        lora_name: str | None = None,
        lower: LowerTierLookup | None = None,
    ) -> RequestPlan:
        """All four steps without a data path (the routing benchmark's engine model)."""
        plan = self.begin(self.make_request(token_ids, cache_salt, lora_name), lower)
        self.allocate(plan)
        self.commit(plan)
        self.finish(plan)
        return plan

    def reset(self) -> bool:
        return self.pool.reset()

    # ------------------------------------------------------------------ helpers
    def _plan_group(self, g: int, spec: GroupSpec, req: Request, hit: CacheHit) -> GroupPlan:
        b = spec.block_size
        n = len(req.token_ids)
        digests = req.hashes[b]
        gp = GroupPlan(g, spec, digests)
        hit_blocks = hit.hit_tokens // b
        pool = self.pool

        def reuse_or_load(i: int) -> None:
            key = make_offload_key(digests[i], g)
            bid = pool.get_cached_block(key)
            if bid is not None:
                gp.blocks[i] = bid
            else:  # counted as a hit, so the lower tier has it: load it back
                gp.pending[i] = key
                gp.to_cache.append(i)

        if spec.rule == "mamba":
            if hit_blocks > 0:
                reuse_or_load(hit_blocks - 1)
            last = n // b - 1  # the checkpoint this request leaves behind
            if last >= 0 and (last in gp.blocks or last in gp.pending):
                return gp  # the hit itself is that checkpoint
            bid = None
            if last >= 0:
                bid = pool.get_cached_block(make_offload_key(digests[last], g))
            if bid is not None:
                gp.blocks[last] = bid
            elif last >= 0:
                gp.pending[last] = None
                gp.to_cache.append(last)
            else:  # shorter than a block: a running state that is never cached
                gp.pending[-1] = None
            return gp

        first = 0
        if spec.rule == "sliding":
            first = max(0, hit_blocks - spec.window_blocks)
        total = -(-n // b)
        full = n // b
        for i in range(first, hit_blocks):
            reuse_or_load(i)
        for i in range(hit_blocks, total):
            bid = pool.get_cached_block(make_offload_key(digests[i], g)) if i < full else None
            if bid is not None:
                gp.blocks[i] = bid
            else:
                gp.pending[i] = None
                if i < full:
                    gp.to_cache.append(i)
        return gp

    def _cache_group(self, gp: GroupPlan, req: Request) -> None:
        """Cache ``to_cache`` as chains of consecutive indices, one BlockStored per chain."""
        if not gp.to_cache:
            return
        b = gp.spec.block_size
        indices = sorted(gp.to_cache)
        lora = request_lora(req.lora_name)
        start = 0
        for k in range(1, len(indices) + 1):
            if k < len(indices) and indices[k] == indices[k - 1] + 1:
                continue
            run = indices[start:k]
            lo, hi = run[0], run[-1] + 1
            extra = [block_extra_keys(i, req.cache_salt, lora) for i in run]
            self.pool.cache_blocks(
                gp.group_idx,
                [gp.blocks[i] for i in run],
                gp.digests[lo:hi],
                gp.digests[lo - 1] if lo > 0 else None,
                req.token_ids[lo * b : hi * b],
                lora_name=req.lora_name,
                extra_keys=extra if any(e is not None for e in extra) else None,
            )
            start = k

    @staticmethod
    def _advance(plan: RequestPlan, expected: str, new: str) -> None:
        if plan.state != expected:
            raise RuntimeError(f"request plan is {plan.state!r}, expected {expected!r}")
        plan.state = new
