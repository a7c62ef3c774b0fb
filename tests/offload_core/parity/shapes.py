"""Engine shapes and a seeded request sequence shared by the vLLM recorder and the
parity test (stdlib only: imported from both vLLM's venv and kvroute's)."""

from __future__ import annotations

import random
from typing import Any

# name -> (groups as `kvroute engine --groups`, num_blocks, hash_block_size, eagle, retention)
SHAPES: dict[str, tuple[str, int, int | None, bool, int | None]] = {
    "full": ("full:16", 48, None, False, None),
    "full_swa_wide": ("full:16,swa:16:512", 96, None, False, None),
    "full_swa_narrow": ("full:32,swa:32:64", 64, None, False, None),
    "full_mamba": ("full:16,mamba:64", 96, None, False, None),
    "mla_swa": ("mla:256,swa:64:128", 48, 64, False, None),
    "eagle": ("full:16,swa:16:64", 96, None, True, None),
    "eagle_full": ("full:16", 48, None, True, None),
    "retention": ("full:16,swa:16:32", 96, None, False, 64),
}


def requests(seed: int = 7, n: int = 60) -> list[dict[str, Any]]:
    """Prompts with shared prefixes, exact resends (aligned and not), extensions,
    LoRA/salt variants; ``max_tokens`` small so decode fills blocks sometimes."""
    rng = random.Random(seed)
    systems = [
        [rng.randrange(1, 32000) for _ in range(rng.choice((64, 100, 256)))] for _ in range(3)
    ]
    history: list[list[int]] = []
    out: list[dict[str, Any]] = []
    for i in range(n):
        r = rng.random()
        if history and r < 0.25:
            toks = list(rng.choice(history))  # exact resend
        elif history and r < 0.55:
            base = rng.choice(history)
            toks = base + [rng.randrange(1, 32000) for _ in range(rng.randrange(1, 90))]
        else:
            toks = list(rng.choice(systems)) + [
                rng.randrange(1, 32000) for _ in range(rng.randrange(0, 200))
            ]
        history.append(toks)
        out.append(
            {
                "token_ids": toks,
                "max_tokens": rng.choice((1, 1, 3, 20)),
                "lora_name": "ad1" if i % 11 == 5 else None,
                "cache_salt": "s1" if i % 13 == 7 else None,
            }
        )
    return out
