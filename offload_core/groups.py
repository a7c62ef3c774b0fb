"""KV cache group specs from the command line (``full:16,swa:16:1024,mamba:16``).

One comma-separated item per group, in group-index order: ``KIND:BLOCK_SIZE`` or, for a
sliding window, ``swa:BLOCK_SIZE:WINDOW_TOKENS``. Kinds are normalised to the names vLLM
publishes in ``kv_cache_spec_kind`` (``full_attention``, ``sliding_window``, ``mamba``,
``mla_attention``), so events and the hit rule speak the same words. No torch.
"""

from __future__ import annotations

from collections.abc import Sequence

from schemas.hit_rule import KIND_FULL, KIND_MAMBA, KIND_SLIDING, GroupSpec

KIND_MLA = "mla_attention"

_ALIASES: dict[str, str] = {
    "full": KIND_FULL,
    "full_attention": KIND_FULL,
    "attn": KIND_FULL,
    "swa": KIND_SLIDING,
    "sliding": KIND_SLIDING,
    "sliding_window": KIND_SLIDING,
    "mamba": KIND_MAMBA,
    "mla": KIND_MLA,
    "mla_attention": KIND_MLA,
}
_SHORT: dict[str, str] = {
    KIND_FULL: "full",
    KIND_SLIDING: "swa",
    KIND_MAMBA: "mamba",
    KIND_MLA: "mla",
}


def _positive(text: str, what: str, item: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"group {item!r}: {what} must be an integer, got {text!r}") from None
    if value <= 0:
        raise ValueError(f"group {item!r}: {what} must be positive, got {value}")
    return value


def parse_group(item: str) -> GroupSpec:
    """One ``KIND:BLOCK_SIZE[:WINDOW]`` item -> GroupSpec (raises ValueError on bad input)."""
    parts = [p.strip() for p in item.strip().split(":")]
    kind = _ALIASES.get(parts[0].lower())
    if kind is None:
        raise ValueError(
            f"group {item!r}: unknown kind {parts[0]!r}; expected one of {sorted(_ALIASES)}"
        )
    if kind == KIND_SLIDING:
        if len(parts) != 3:
            raise ValueError(f"group {item!r}: expected swa:BLOCK_SIZE:WINDOW_TOKENS")
        return GroupSpec(
            kind, _positive(parts[1], "block size", item), _positive(parts[2], "window", item)
        )
    if len(parts) != 2:
        raise ValueError(f"group {item!r}: expected {parts[0]}:BLOCK_SIZE")
    return GroupSpec(kind, _positive(parts[1], "block size", item))


def parse_groups(text: str) -> list[GroupSpec]:
    """``"full:16,swa:16:1024"`` -> one GroupSpec per group, in group-index order."""
    items = [i for i in text.split(",") if i.strip()]
    if not items:
        raise ValueError("at least one KV cache group is required")
    return [parse_group(i) for i in items]


def format_groups(groups: Sequence[GroupSpec]) -> str:
    """The inverse of ``parse_groups`` (for logs and ``--help`` defaults)."""
    out = []
    for g in groups:
        short = _SHORT.get(g.kind, g.kind)
        if g.kind == KIND_SLIDING:
            out.append(f"{short}:{g.block_size}:{g.sliding_window}")
        else:
            out.append(f"{short}:{g.block_size}")
    return ",".join(out)
