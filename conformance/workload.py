"""Engine-neutral, seeded conformance workloads (stdlib only).

Why: the same list of actions drives vLLM's own ``KVCacheManager`` (``vllm_driver.py``,
in ``.venv-vllm``) and kvroute's simulated engine (``offload_core``, in ``.venv``), so
both can be checked against one recording. Nothing here imports vLLM or kvroute.

A *scenario* (``Scenario``) fixes the engine shape: KV cache groups (``GroupDef``:
kind ``full_attention`` / ``sliding_window`` / ``mamba`` / ``mla``, block size, window),
the hash unit (``hash_block_size``), EAGLE, pool size, DP ranks and a per-step token
budget. ``actions(scenario)`` returns its workload, a list of plain dicts in time order:

``{"op": "add", "request_id": str, "dp_rank": int, "token_ids": [int], "max_tokens": int,
"output_token_ids": [int], "lora_name": str|None, "cache_salt": str|None,
"skip_prefix_cache": bool, "report_full": bool}``
    A request arrives on ``dp_rank`` and waits. ``output_token_ids`` (``max_tokens``
    long) are the tokens its decode steps produce, fixed in advance so every engine
    decodes the same sequence; a request finishes (and is freed) once all are produced.
    ``report_full`` asks vLLM's ``kv_cache_report_mode="full"`` (re-announce the reused
    prefix as stores); ``skip_prefix_cache`` = vLLM's ``skip_reading_prefix_cache``.

``{"op": "step"}``
    One scheduler step on every DP rank, vLLM's order: running requests first (decode
    one token, or the next prefill chunk), then waiting requests FCFS while the step's
    ``token_budget`` lasts (prefill chunked to the remaining budget). A waiting request
    is first looked up in the prefix cache (the *probe*: what the engine would reuse)
    and admitted if its slots fit; otherwise it stays waiting and later steps retry
    (and probe again). A running request whose slots do not fit preempts the newest
    running one (freed, back to the front of the waiting queue, probed again on
    re-admission). Then the step "runs": each scheduled request advances by its
    scheduled tokens; one whose prompt (and outputs so far) is now fully computed gets
    its next output token appended; one with all its output tokens finishes and is
    freed (blocks back to the pool in reverse order, so the tail is evicted first).
    Last, the step's cache events are taken and published as one batch per rank (none
    if empty). Copy-on-write retentions (mamba) are released within the step.

``{"op": "abort", "request_id": str}``
    The request is finished early and freed, wherever it is (ignored if already done).

``{"op": "drain"}``
    Step until no request is waiting or running (bounded); always the last action.

Workload content: shared system prompts, multi-turn conversations whose next prompt is
the previous prompt + its outputs + new user tokens, branches that fork a conversation,
exact resends, LoRA / cache-salt variants and some ``report_full`` / ``skip_prefix_cache``
requests, interleaved with steps so requests overlap and the small pool evicts.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

Action = dict[str, Any]

VOCAB = 32_000


@dataclass(frozen=True)
class GroupDef:
    """One KV cache group (``kind`` as vLLM's events spell it, except ``mla``/``mamba``)."""

    kind: str
    block_size: int
    sliding_window: int | None = None


@dataclass(frozen=True)
class Scenario:
    """An engine shape plus the knobs of its generated workload."""

    name: str
    description: str
    groups: tuple[GroupDef, ...]
    num_blocks: int
    hash_block_size: int | None = None  # None: the smallest group block size
    eagle: bool = False
    retention_interval: int | None = None
    dp_ranks: int = 1
    token_budget: int = 512
    max_model_len: int = 4096
    hash_algo: str = "sha256"
    seed: int = 0
    num_requests: int = 160
    prompt_blocks: tuple[int, int] = (1, 12)  # system-prompt length in hash units
    lora_rate: float = 0.0
    salt_rate: float = 0.0
    report_full_rate: float = 0.0
    skip_rate: float = 0.0
    abort_rate: float = 0.03
    max_prompt_tokens: int = 1024
    max_output_tokens: int = 32
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def unit(self) -> int:
        """Tokens per hash block."""
        if self.hash_block_size is not None:
            return self.hash_block_size
        return min(g.block_size for g in self.groups)


def _tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(1, VOCAB) for _ in range(n)]


def actions(sc: Scenario) -> list[Action]:
    """The scenario's workload (deterministic for a given scenario)."""
    rng = random.Random(f"{sc.name}:{sc.seed}")
    unit = sc.unit
    systems = [
        _tokens(rng, unit * rng.randint(*sc.prompt_blocks) + rng.randrange(unit)) for _ in range(6)
    ]
    loras = ["adapter-a", "adapter-b"]
    # conversation history per id: (token_ids incl. outputs, dp_rank, lora, salt)
    convs: list[tuple[list[int], int, str | None, str | None]] = []
    out: list[Action] = []
    limit = min(sc.max_model_len - sc.max_output_tokens - 1, sc.max_prompt_tokens)
    for i in range(sc.num_requests):
        lora = rng.choice(loras) if rng.random() < sc.lora_rate else None
        salt = f"salt-{rng.randrange(2)}" if rng.random() < sc.salt_rate else None
        rank = rng.randrange(sc.dp_ranks)
        roll = rng.random()
        if convs and roll < 0.40:
            # next turn of an earlier conversation (same rank, same lora/salt)
            j = rng.randrange(len(convs))
            hist, rank, lora, salt = convs[j]
            prompt = hist + _tokens(rng, rng.randint(4, unit * 3))
            if rng.random() < 0.25 and len(hist) > unit:
                # branch: fork before the last turn instead of extending it
                cut = rng.randrange(unit, len(hist))
                prompt = hist[:cut] + _tokens(rng, rng.randint(4, unit * 2))
        elif convs and roll < 0.52:
            hist, rank, lora, salt = rng.choice(convs)
            prompt = list(hist)  # exact resend of a previous prompt + outputs
        else:
            prompt = list(rng.choice(systems)) + _tokens(rng, rng.randint(1, unit * 4))
        if len(prompt) > limit:
            prompt = prompt[:limit]
        max_tokens = rng.randint(1, sc.max_output_tokens)
        outputs = _tokens(rng, max_tokens)
        rid = f"r{i:04d}"
        out.append(
            {
                "op": "add",
                "request_id": rid,
                "dp_rank": rank,
                "token_ids": prompt,
                "max_tokens": max_tokens,
                "output_token_ids": outputs,
                "lora_name": lora,
                "cache_salt": salt,
                "skip_prefix_cache": rng.random() < sc.skip_rate,
                "report_full": rng.random() < sc.report_full_rate,
            }
        )
        convs.append((prompt + outputs, rank, lora, salt))
        if len(convs) > 24:
            convs.pop(rng.randrange(len(convs)))
        if rng.random() < sc.abort_rate:
            out.append({"op": "abort", "request_id": rid})
        for _ in range(rng.choice((0, 0, 1, 1, 2, 4))):
            out.append({"op": "step"})
    out.append({"op": "drain"})
    return out
