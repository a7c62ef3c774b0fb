"""One request through ``VKVCacheManager`` the way vLLM 0.33's scheduler drives it.

The scheduler, not only the cache manager, decides what gets cached: with a mamba group
(``align`` mode) it cuts a prefill into chunks that end where a state must be kept
(block boundaries, the prompt's last hash-unit boundary, a shared-prefix junction), and
each chunk is a separate ``allocate_slots``. Decode appends one token per step. A
request is freed (tail first) when it finishes. Pure Python, no torch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from offload_core.kv_cache import RequestTooLargeError
from offload_core.vcache import VKVCacheManager, VRequest
from offload_core.vmamba import MambaManager
from offload_core.vmanagers import mamba_checkpoint_position


@dataclass(slots=True)
class RunInfo:
    local_tokens: int  # prefix-cache hit on the GPU pool
    external_tokens: int  # hit beyond it loaded from a lower tier
    loaded: int = 0
    computed: int = 0

    @property
    def cached_tokens(self) -> int:
        """What vLLM reports as ``prompt_tokens_details.cached_tokens``."""
        return self.local_tokens + self.external_tokens


def mamba_chunk(kv: VKVCacheManager, req: VRequest, num_new: int, start: int) -> int:
    """Clip a prefill chunk starting at ``start`` to end where mamba state must be cached
    (vLLM's ``_mamba_block_aligned_split`` with no prefill-checkpoint blocks)."""
    prefill_end = max(req.num_prompt_tokens, req.num_tokens - 1)
    if start >= prefill_end:
        return num_new
    block = kv.step  # the scheduler's block size: the lcm of the group block sizes
    unit = kv.hash_block_size
    last_cache = mamba_checkpoint_position(req.num_tokens, block, kv.eagle)
    end = start + num_new
    if end < prefill_end:
        end = end // block * block  # chunk ends stay block aligned
    next_boundary = (start // block + 1) * block
    partial = kv.partial_hits and unit < block
    tail = mamba_checkpoint_position(req.num_prompt_tokens, unit, kv.eagle) if partial else 0
    junction = req.shared_prefix_boundary
    junction_stop = start + (junction - start) // block * block
    stops = (
        next_boundary if start % block else 0,
        last_cache,
        tail if last_cache < tail < req.num_prompt_tokens else 0,
        junction_stop if start < junction < end else 0,
    )
    end = min((s for s in stops if start < s < end), default=end)
    return max(end - start, 0)


def _next_token(req: VRequest) -> int:
    """A deterministic stand-in for sampling (same history -> same output)."""
    return (req.num_tokens * 7919 + sum(req.token_ids[-4:])) % 32000


def serve_request(
    kv: VKVCacheManager,
    req: VRequest,
    external_hit: Callable[[VRequest, int], int] | None = None,
    max_tokens: int = 1,
    after_alloc: Callable[[VRequest, int, int, bool], tuple[int, int]] | None = None,
    output: Sequence[int] = (),
) -> RunInfo:
    """Admit, prefill (chunked where mamba needs it), decode, free.

    ``output``: the tokens "sampled", in order (the HTTP layer's answer), else a
    deterministic stand-in; as in vLLM, every one but the last is decoded into the cache
    (as far as the pool holds them: vLLM sizes its cache for a whole request).

    ``external_hit(req, local)`` returns the tokens a lower tier adds beyond the local
    hit; ``after_alloc(req, local, external, first)`` moves data after each allocation
    and returns (blocks loaded, blocks computed). Raises RequestTooLargeError (with the
    request freed) when the pool cannot hold a step.
    """
    blocks, local, boundary = kv.get_computed_blocks(req)
    req.shared_prefix_boundary = boundary
    external = external_hit(req, local) if external_hit is not None else 0
    info = RunInfo(local, external)
    has_mamba = any(isinstance(m, MambaManager) for m in kv.managers)
    first = True
    generated = 0
    try:
        while True:
            kv.new_step_starts()
            if first:
                start = local + external
                num_new = req.num_tokens - start
            else:
                start = req.num_computed_tokens
                num_new = req.num_tokens - start
            if has_mamba:
                num_new = mamba_chunk(kv, req, num_new, start)
            ok = kv.allocate_slots(
                req,
                num_new,
                local if first else 0,
                blocks if first else None,
                num_external_computed_tokens=external if first else 0,
            )
            if not ok and generated:
                break  # the pool is full mid-answer: the rest of it is not cached
            if not ok:
                raise RequestTooLargeError(
                    f"request {req.request_id} ({req.num_tokens} tokens) does not fit: "
                    f"{kv.pool.num_free_blocks} free blocks"
                )
            if after_alloc is not None:
                loaded, computed = after_alloc(req, local, external, first)
                info.loaded += loaded
                info.computed += computed
            req.num_computed_tokens = start + num_new
            kv.release(kv.take_copies())
            first = False
            if req.num_computed_tokens < req.num_tokens:
                continue  # more prompt chunks
            generated += 1
            if generated >= max_tokens:
                break
            req.append_tokens(
                [output[generated - 1] if generated <= len(output) else _next_token(req)]
            )
    finally:
        kv.free(req)
    return info
