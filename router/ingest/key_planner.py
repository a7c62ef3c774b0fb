"""Block keys for every store of one batch, before any operation is emitted.

Why a separate pass: a store's keys need its parent's key, and in vLLM's streams the
parent is often named only by *another* store of the same batch -- a sliding-window or
mamba group skips blocks the full-attention group announces, and the groups of one step
come in group order, not dependency order. So keys are computed to a fixed point (dense
stores first: they name the blocks sparse stores are placed against), and only then do
the operations go out in event order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, cast

from router.index.base import BlockKey, EngineHash, WorkerState
from router.ingest.block_keys import (
    ExtraKeys,
    chain_keys,
    detect_engine_hash,
    key_bytes,
    root_digest,
    split_extra_keys,
)
from router.ingest.packed import tokens
from router.ingest.placement import block_keys_at, place_sparse
from router.ingest.sglang_keys import detect_sglang_hash
from schemas import BlockStored, KVEventBatch


@dataclass
class Keyed:
    """What a store contributes: the blocks it can place, and what it could not."""

    hashes: list[EngineHash] = field(default_factory=list)
    keys: list[BlockKey] = field(default_factory=list)
    unknown_parent: int = 0
    partial_unknown_prefix: int = 0  # a partial entry whose block's earlier units no event named
    unresolved: int = 0
    unplaced: int = 0
    sparse: bool = False
    reannounce: bool = False  # a hit prefix re-announced, not new copies
    error: str | None = None
    algo_checked: str | None = None  # "engine"/"canonical" once a chain start was checked


_WAIT = object()


class KeyPlanner:
    """Computes ``Keyed`` per store index of a batch, updating ``known`` as it goes."""

    def __init__(
        self,
        state: WorkerState,
        batch: KVEventBatch,
        known: dict[EngineHash, BlockKey],
        default_block_size: int | None = None,
        recent: Sequence[tuple[Any, Sequence[BlockKey]]] | None = None,
    ) -> None:
        self.default_block_size = default_block_size
        self.unit = state.hash_unit
        self.check_algo = state.hash_mode == "unknown"
        self.groups = state.groups
        self.events = batch.events
        self.known = known
        # Token ranges whose unit keys were computed: (tokens, unit keys, this batch?)
        self.ranges: list[tuple[Any, Sequence[BlockKey], bool]] = [
            (tokens(t), u, False) for t, u in (recent or ())
        ]
        # Stores that re-announce a hit (``router.ingest.reannounce``): no new copies.
        self.reannounced: set[int] = set()

    @cached_property
    def salts(self) -> list[str | None]:
        """Salts of this batch's chain starts: a sparse store that skipped block 0 does not
        carry the salt its chain is rooted at, a dense store of the same step does (read
        only when such a sparse store is keyed)."""
        salts: list[str | None] = []
        for ev in self.events:
            if isinstance(ev, BlockStored) and ev.parent_block_hash is None and ev.token_ids:
                salt = _chain_salt(ev, split_extra_keys(ev.extra_keys, 1, ev.lora_name))
                if salt not in salts:
                    salts.append(salt)
        return salts

    def run(self) -> dict[int, Keyed]:
        out: dict[int, Keyed] = {}
        dense: list[int] = []
        sparse: list[int] = []
        for i, ev in enumerate(self.events):
            if not isinstance(ev, BlockStored) or not ev.block_hashes:
                continue
            if i in self.reannounced:
                out[i] = Keyed(reannounce=True)
                continue
            bs = self.block_size(ev)
            if bs is not None and len(ev.block_hashes) * bs != len(ev.token_ids):
                sparse.append(i)
            else:
                dense.append(i)
        pending = self._fixpoint(dense, out)
        pending = self._fixpoint(pending + sparse, out)
        while pending:  # parents no event names: find them by their tokens (see _locate)
            located = [i for i in pending if self._locate(i, out)]
            if not located:
                break
            pending = self._fixpoint([i for i in pending if i not in located], out)
        for i in pending:
            ev = self.events[i]
            assert isinstance(ev, BlockStored)
            got = out[i] = self._named_only(ev, unknown_parent=True)
            if self._partial_inside(ev):
                got.partial_unknown_prefix, got.unknown_parent = got.unknown_parent, 0
        return out

    def _partial_inside(self, ev: BlockStored) -> bool:
        """A vLLM partial entry (``cache_partial_block``: one hash unit, the prompt's last
        boundary inside a larger block) that does not start its block: its parent is a
        unit inside that block, and the units between the block start and it are in no
        event (vLLM publishes a block's tokens only once the block is full), so its key
        cannot be computed from the stream (``place_partial`` finds it by its tokens)."""
        unit = self.unit
        if not unit or ev.block_size != unit or len(ev.block_hashes) != 1:
            return False
        return self.group_size(ev) > unit

    @cached_property
    def group_sizes(self) -> dict[int, int]:
        """Each group's engine block size: learned, or the largest a store of this batch
        shows (a group's first batch); a group never seen with a whole block is taken to
        share the others' (vLLM aligns the block sizes of hybrid mamba models)."""
        sizes = {g: m.block_size * m.block_units for g, m in self.groups.items()}
        for ev in self.events:
            if (
                isinstance(ev, BlockStored)
                and isinstance(ev.block_size, int)
                and ev.block_size > (self.unit or 0)
            ):
                g = ev.group_idx if isinstance(ev.group_idx, int) else 0
                sizes[g] = max(sizes.get(g, 0), ev.block_size)
        return sizes

    def _locate(self, i: int, out: dict[int, Keyed]) -> bool:
        """A parent no event names (a unit a sliding-window or mamba group skipped, or a
        block offloaded from such a group) lies inside a token range another store
        covered: this batch's or a recent one's, whose unit keys were all computed. Find
        where this store's tokens continue such a range, take the unit key before that
        point as the parent, and accept the keys only if every block the map already
        names agrees (or the range is from this very batch and the match spans more than
        one unit)."""
        ev = self.events[i]
        assert isinstance(ev, BlockStored)
        unit, tokens = self.unit, ev.token_ids
        if not unit or not tokens or ev.parent_block_hash is None:
            return False
        if self._partial_inside(ev):
            return self._locate_partial(i, out)
        for r_tokens, r_units, here in reversed(self.ranges):
            span = len(r_units) * unit
            for off in range(unit, span, unit):
                m = min(len(tokens), span - off)
                if m < unit or r_tokens[off : off + m] != tokens[:m]:
                    continue
                named = any(h in self.known for h in ev.block_hashes)
                if not (named or (here and m > unit)):
                    continue
                got = self._keys(ev, parent=key_bytes(r_units[off // unit - 1]))
                if isinstance(got, Keyed) and got.hashes and not got.unplaced:
                    out[i] = got
                    return True
        return False

    def _locate_partial(self, i: int, out: dict[int, Keyed]) -> bool:
        ev = self.events[i]
        assert isinstance(ev, BlockStored)
        got = self.place_partial(ev)
        if got is None:
            return False
        out[i] = got
        return True

    def place_partial(self, ev: BlockStored) -> Keyed | None:
        """A partial entry inside a block (see ``_partial_inside``) placed by its one
        unit of tokens: where a store of whole blocks (this batch's or a recent one's)
        holds those tokens at a position inside a block a partial entry can take (not a
        block's first unit, whose parent is named, nor its last, a block boundary).
        Accepted only when every such place gives the same parent: a unit of tokens
        repeated under another prefix leaves it unplaced, not guessed (docs/vllm.md)."""
        unit, tokens = self.unit, ev.token_ids
        if not unit or len(tokens) != unit:
            return None
        size = self.group_size(ev)
        k = size // unit
        first = tokens[0]
        parents: set[BlockKey] = set()
        for r_tokens, r_units, _ in self.ranges:
            if len(r_tokens) % size or len(r_units) * unit != len(r_tokens):
                continue  # not whole blocks of this size from a block boundary
            for j in range(1, k - 1):
                for off in range(j * unit, len(r_tokens), size):
                    if r_tokens[off] == first and r_tokens[off : off + unit] == tokens:
                        parents.add(r_units[off // unit - 1])
                        if len(parents) > 1:
                            return None
        if not parents:
            return None
        got = self._keys(ev, parent=key_bytes(parents.pop()))
        if isinstance(got, Keyed) and got.hashes and not got.unplaced:
            return got
        return None

    def key_with_parent(self, ev: BlockStored) -> Keyed | None:
        """``ev``'s keys once the map names its parent (a waiting partial entry)."""
        got = self._keys(ev)
        if isinstance(got, Keyed) and got.hashes and not got.unplaced and not got.error:
            return got
        return None

    def group_size(self, ev: BlockStored) -> int:
        """The engine block size of the event's group (see ``group_sizes``)."""
        g = ev.group_idx if isinstance(ev.group_idx, int) else 0
        sizes = self.group_sizes
        return sizes.get(g, max(sizes.values(), default=0))

    def new_partial_slots(self) -> set[int]:
        """First tokens of every unit of this batch's whole-block ranges where a partial
        entry inside a block could start (candidates for waiting partial entries)."""
        unit = self.unit
        out: set[int] = set()
        if not unit:
            return out
        sizes = {v for v in self.group_sizes.values() if v > unit}
        for r_tokens, _, here in self.ranges:
            for size in sizes:
                if not here or len(r_tokens) % size:
                    continue
                for j in range(1, size // unit - 1):
                    out.update(r_tokens[j * unit :: size])
        return out

    def block_size(self, ev: BlockStored) -> int | None:
        """The event's block size, or the configured default for an engine leaving it
        out (0 or absent)."""
        bs = ev.block_size
        if isinstance(bs, bool) or not isinstance(bs, int) or bs <= 0:
            return self.default_block_size
        return bs

    def _fixpoint(self, todo: list[int], out: dict[int, Keyed]) -> list[int]:
        while todo:
            waiting = []
            for i in todo:
                got = self._keys(cast(BlockStored, self.events[i]))  # only stores are queued
                if got is _WAIT:
                    waiting.append(i)
                else:
                    assert isinstance(got, Keyed)
                    out[i] = got
            if len(waiting) == len(todo):
                return waiting
            todo = waiting
        return []

    def _named_only(self, ev: BlockStored, *, unknown_parent: bool = False) -> Keyed:
        """Only the blocks the map already names; the rest is counted, not guessed."""
        res = Keyed()
        for h in ev.block_hashes:
            k = self.known.get(h)
            if k is not None:
                res.hashes.append(h)
                res.keys.append(k)
        missing = len(ev.block_hashes) - len(res.hashes)
        if unknown_parent:
            res.unknown_parent = missing
        else:
            res.unresolved = missing
        return res

    def _keys(self, ev: BlockStored, parent: bytes | None = None) -> Keyed | object:
        hashes = ev.block_hashes
        known = self.known
        if not ev.token_ids:
            # Token-less stores (vLLM's offload connector): the map names what they copy.
            return self._named_only(ev)
        bs, unit, tokens = self.block_size(ev), self.unit, ev.token_ids
        if bs is None or not unit:
            return Keyed(error=f"invalid block_size {ev.block_size!r}")
        if bs % unit:
            return Keyed(error=f"block_size {bs} is not a multiple of the hash unit {unit}")
        n = len(hashes)
        if len(tokens) % bs or len(tokens) < n * bs:
            return Keyed(error="token_ids length does not fit block_hashes and block_size")
        total = len(tokens) // bs
        names = [known.get(h) for h in hashes]
        if n == total and None not in names:
            return Keyed(list(hashes), names)  # type: ignore[arg-type]
        res = Keyed(sparse=n < total)
        parent_hash = ev.parent_block_hash
        extra = split_extra_keys(ev.extra_keys, n, ev.lora_name)
        if parent is not None:  # located by its tokens (``_locate``)
            roots = [parent]
        elif parent_hash is None:
            roots = [root_digest(extra.lora_name, _chain_salt(ev, extra))]
            if res.sparse:
                roots += [root_digest(extra.lora_name, s) for s in self.salts]
        else:
            parent_key = known.get(parent_hash)
            if parent_key is None:
                return _WAIT
            roots = [key_bytes(parent_key)]
        # Extra keys (multimodal, embeddings) are per listed block: they place onto a
        # dense store's blocks; a sparse store's are unknown for the skipped blocks.
        others = extra.others if not res.sparse and unit == bs else None
        keys: list[BlockKey] | None = None
        for root in dict.fromkeys(roots):
            units = chain_keys(root, tokens, unit, len(tokens) // unit, others)
            block_keys = block_keys_at(units, bs // unit)
            got = place_sparse(hashes, block_keys, known) if res.sparse else block_keys
            if got is not None and _anchored(hashes, got, known):
                keys = got
                self.ranges.append((tokens, units, True))
                break
        if keys is None:
            res.unplaced = n
            return res
        res.hashes, res.keys = list(hashes), keys
        known.update(zip(hashes, keys, strict=True))
        if self.check_algo and parent_hash is None and not res.sparse and bs == unit:
            first = ev.extra_keys[0] if ev.extra_keys else None
            vllm = detect_engine_hash(hashes[0], tokens[:bs], first) is not None
            if vllm or detect_sglang_hash(hashes[0], tokens[:bs], ev.cache_salt):
                res.algo_checked = "engine"
                self.check_algo = False
            elif ev.lora_name is None:  # SGLang LoRA chains: decide on a later chain
                res.algo_checked = "canonical"
                self.check_algo = False
        return res


def _chain_salt(ev: BlockStored, extra: ExtraKeys) -> str | None:
    """The salt a chain start is rooted at: vLLM carries it in ``extra_keys``, SGLang as
    a field of the event."""
    return extra.cache_salt if extra.cache_salt is not None else ev.cache_salt


def _anchored(
    hashes: list[EngineHash], keys: list[BlockKey], known: dict[EngineHash, BlockKey]
) -> bool:
    """Every block the map names was placed at its named key (the root was right)."""
    return all(known.get(h, k) == k for h, k in zip(hashes, keys, strict=True))
