"""A request as the simulated cache manager sees it: tokens, hashes per hash unit, progress.

Its own module because the cache manager and the per-type group managers all read it
(one definition, no import cycle between them).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from schemas.hashing import block_extra_keys, hash_function, none_hash


@dataclass(slots=True)
class VRequest:
    """A request as the cache manager sees it: tokens, hashes per hash unit, progress."""

    request_id: str
    token_ids: list[int]
    num_prompt_tokens: int
    hash_block_size: int
    hash_algo: str = "sha256"
    hash_seed: str | None = None
    lora_name: str | None = None
    lora_path: str | None = None
    lora_id: int | None = None
    cache_salt: str | None = None
    session_id: str | None = None
    num_computed_tokens: int = 0
    shared_prefix_boundary: int = 0
    skip_prefix_cache: bool = False  # vLLM's skip_reading_prefix_cache
    report_full: bool = False  # vLLM's kv_cache_report_mode="full": re-announce hits
    block_hashes: list[bytes] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.token_ids = list(self.token_ids)
        self._update_hashes()

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    def _lora(self) -> tuple[str, str] | None:
        if self.lora_name is None:
            return None
        return (self.lora_name, self.lora_path or "")

    def append_tokens(self, token_ids: Sequence[int]) -> None:
        """Decode output: the hash chain grows as hash units fill."""
        self.token_ids += token_ids
        self._update_hashes()

    def _update_hashes(self) -> None:
        unit = self.hash_block_size
        fn = hash_function(self.hash_algo)
        lora = self._lora()
        while (len(self.block_hashes) + 1) * unit <= len(self.token_ids):
            i = len(self.block_hashes)
            parent = self.block_hashes[-1] if i else none_hash(self.hash_algo, self.hash_seed)
            extra = block_extra_keys(i, self.cache_salt, lora)
            chunk = tuple(self.token_ids[i * unit : (i + 1) * unit])
            self.block_hashes.append(fn((parent, chunk, extra)))

    def event_extra_keys(self, start: int, end: int) -> tuple[Any, ...] | None:
        """Extra keys as vLLM publishes them: untagged (the LoRA name, the salt)."""
        keys: list[Any] = []
        if self.lora_name is not None:
            keys.append(self.lora_name)
        if start == 0 and self.cache_salt:
            keys.append(self.cache_salt)
        return tuple(keys) if keys else None
