"""Turning an offloading tier's key events into vLLM-format KV events.

An ``OffloadingEvent`` only carries keys. A router that keys blocks by its own chain over
``token_ids`` needs each stored block's parent and tokens, as for GPU blocks, so the
engine remembers them (``BlockMeta``) when it offloads a block and this translator
re-links the stored keys into parent chains: one ``BlockStored`` per chain, one
``BlockRemoved`` per group. No torch.
"""

from __future__ import annotations

from collections.abc import Sequence

from offload_core.base import (
    OffloadingEvent,
    OffloadKey,
    get_offload_block_hash,
    get_offload_group_idx,
)
from offload_core.block_pool import BlockMeta, lora_id_for
from schemas import BlockRemoved, BlockStored, ExternalBlockHash, KVEvent
from schemas.hashing import external_hash
from schemas.hit_rule import KIND_SLIDING, GroupSpec


class TierEventTranslator:
    def __init__(self, groups: Sequence[GroupSpec]) -> None:
        self.groups = list(groups)
        # Parent/tokens of blocks stored (or being stored) in the tier.
        self.meta: dict[OffloadKey, BlockMeta | None] = {}

    def remember(self, key: OffloadKey, meta: BlockMeta | None) -> None:
        self.meta[key] = meta

    def forget(self, keys: Sequence[OffloadKey]) -> None:
        """Drop what a failed store reserved."""
        for key in keys:
            self.meta.pop(key, None)

    def clear(self) -> None:
        self.meta.clear()

    def translate(self, ev: OffloadingEvent) -> list[KVEvent]:
        by_group: dict[int, list[OffloadKey]] = {}
        for key in ev.keys:
            by_group.setdefault(get_offload_group_idx(key), []).append(key)
        out: list[KVEvent] = []
        for group, keys in by_group.items():
            hashes: list[ExternalBlockHash] = [
                external_hash(get_offload_block_hash(k)) for k in keys
            ]
            if ev.removed:
                out.append(BlockRemoved(hashes, ev.medium, group_idx=group))
                self.forget(keys)
            else:
                out += [self._stored(group, chain, ev.medium) for chain in self._chains(keys)]
        return out

    def _chains(self, keys: list[OffloadKey]) -> list[list[OffloadKey]]:
        """Order one group's keys into parent->child chains (offload order is eviction
        order, i.e. usually tail first, and prefixes may branch)."""
        present = {get_offload_block_hash(k): k for k in keys}
        children: dict[bytes, list[OffloadKey]] = {}
        starts: list[OffloadKey] = []
        for key in keys:
            meta = self.meta.get(key)
            if meta is not None and meta.parent is not None and meta.parent in present:
                children.setdefault(meta.parent, []).append(key)
            else:
                starts.append(key)
        chains: list[list[OffloadKey]] = []
        done: set[OffloadKey] = set()
        pending = list(reversed(starts))
        while pending:
            head: OffloadKey | None = pending.pop()
            if head in done:
                continue
            chain = []
            while head is not None and head not in done:
                done.add(head)
                chain.append(head)
                kids = children.get(get_offload_block_hash(head), [])
                pending += reversed(kids[1:])  # branches start chains of their own
                head = kids[0] if kids else None
            chains.append(chain)
        chains += [[k] for k in keys if k not in done]  # only reachable through a cycle
        return chains

    def _stored(self, group: int, keys: list[OffloadKey], medium: str) -> BlockStored:
        spec = self.groups[group]
        metas = [self.meta.get(k) for k in keys]
        first = metas[0]
        tokens: list[int] = []
        for m in metas:
            if m is None or len(m.token_ids) != spec.block_size:
                tokens = []  # unknown for one block: say nothing rather than misalign
                break
            tokens += m.token_ids
        extra = [m.extra_keys if m is not None else None for m in metas]
        lora_name = first.lora_name if first is not None else None
        parent = first.parent if first is not None else None
        return BlockStored(
            block_hashes=[external_hash(get_offload_block_hash(k)) for k in keys],
            parent_block_hash=None if parent is None else external_hash(parent),
            token_ids=tokens,
            block_size=spec.block_size,
            lora_id=lora_id_for(lora_name),
            medium=medium,
            lora_name=lora_name,
            extra_keys=extra if any(e is not None for e in extra) else None,
            group_idx=group,
            kv_cache_spec_kind=spec.kind,
            kv_cache_spec_sliding_window=spec.sliding_window if spec.kind == KIND_SLIDING else None,
        )
