"""The recorded engine shapes (stdlib only; shared by the vLLM driver and the tests).

Pools are small so eviction happens; budgets are small so prefills are chunked.
"""

from __future__ import annotations

from conformance.workload import GroupDef, Scenario

FULL = "full_attention"
SWA = "sliding_window"

SCENARIOS: tuple[Scenario, ...] = (
    Scenario(
        name="full",
        description="full attention only, block 16",
        groups=(GroupDef(FULL, 16),),
        num_blocks=96,
        token_budget=256,
    ),
    Scenario(
        name="full_lora_salt",
        description="full attention, block 16; LoRA, cache_salt, skip-cache and "
        "kv_cache_report_mode=full requests mixed in",
        groups=(GroupDef(FULL, 16),),
        num_blocks=160,
        token_budget=256,
        lora_rate=0.3,
        salt_rate=0.3,
        report_full_rate=0.25,
        skip_rate=0.05,
    ),
    Scenario(
        name="swa_wide",
        description="full + sliding window 512, block 16 (window >= alignment)",
        groups=(GroupDef(FULL, 16), GroupDef(SWA, 16, 512)),
        num_blocks=320,
        token_budget=256,
    ),
    Scenario(
        name="swa_narrow",
        description="full + sliding window 64, block 32 (window < alignment of long hits)",
        groups=(GroupDef(FULL, 32), GroupDef(SWA, 32, 64)),
        num_blocks=200,
        token_budget=256,
        prompt_blocks=(1, 8),
    ),
    Scenario(
        name="mamba_align",
        description="full attention block 64 + mamba (align mode) block 64",
        groups=(GroupDef(FULL, 64), GroupDef("mamba", 64)),
        num_blocks=160,
        token_budget=512,
        prompt_blocks=(1, 6),
    ),
    Scenario(
        name="mamba_partial",
        description="full attention block 64 + mamba align block 64, hash_block_size 16 "
        "(partial-hash hits enabled)",
        groups=(GroupDef(FULL, 64), GroupDef("mamba", 64)),
        hash_block_size=16,
        num_blocks=160,
        token_budget=512,
        prompt_blocks=(2, 20),
    ),
    Scenario(
        name="mla_swa_mixed",
        description="MLA block 256 + sliding window 128 at block 64, hash_block_size 64 "
        "(mixed block sizes, partial blocks)",
        groups=(GroupDef("mla", 256), GroupDef(SWA, 64, 128)),
        hash_block_size=64,
        num_blocks=120,
        token_budget=512,
        prompt_blocks=(1, 12),
    ),
    Scenario(
        name="eagle",
        description="full attention block 16 with EAGLE (last matched block dropped)",
        groups=(GroupDef(FULL, 16),),
        eagle=True,
        num_blocks=160,
        token_budget=256,
    ),
    Scenario(
        name="retention",
        description="full + sliding window 64, block 16, prefix_cache_retention_interval 64",
        groups=(GroupDef(FULL, 16), GroupDef(SWA, 16, 64)),
        retention_interval=64,
        num_blocks=240,
        token_budget=256,
    ),
    Scenario(
        name="dp2",
        description="two DP ranks (two managers, publishers on port and port+1), "
        "full + sliding window 128, block 16",
        groups=(GroupDef(FULL, 16), GroupDef(SWA, 16, 128)),
        dp_ranks=2,
        num_blocks=200,
        token_budget=256,
        num_requests=240,
        report_full_rate=0.2,
    ),
)

BY_NAME = {sc.name: sc for sc in SCENARIOS}
