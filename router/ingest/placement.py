"""Where the blocks of one ``BlockStored`` sit in its token range (vLLM 0.33's shapes).

Why this exists: vLLM's ``cache_full_blocks`` skips null and masked blocks (a sliding
window keeps only the blocks a later hit can reach, mamba in align mode only its state
blocks), so an event may list fewer hashes than its ``token_ids`` hold blocks -- without
positions. And every group hashes one chain at ``hash_block_size`` (the *unit*): a group
of block size ``k * unit`` names its block by the chain value at the block's last unit.

So the router keys entries by its own chain at the unit: the key of a group's block ``i``
is the unit key at index ``(i + 1) * k - 1``, and a partial entry (a store whose
``block_size`` is the unit inside a larger group) is the unit key at its own boundary.
Placing a sparse store's hashes then needs no guess where the map already names them
(another group of the same request usually announced them densely); the hashes it does
not name are placed the way vLLM's retention masks keep blocks: as runs that end right
before the next named block or at the end of the range.
"""

from __future__ import annotations

from collections.abc import Sequence

from router.index.base import BlockKey, EngineHash


def block_keys_at(unit_keys: Sequence[BlockKey], per_block: int) -> list[BlockKey]:
    """The keys of blocks of ``per_block`` units: every ``per_block``-th unit key."""
    if per_block == 1:
        return list(unit_keys)
    return list(unit_keys[per_block - 1 :: per_block])


def place_sparse(
    hashes: Sequence[EngineHash],
    block_keys: Sequence[BlockKey],
    named: dict[EngineHash, BlockKey],
) -> list[BlockKey] | None:
    """Keys of ``hashes`` (a subsequence, in order, of the range's blocks), or None when
    the named ones contradict the order (the event does not fit this range).

    ``named`` maps engine hashes already known to their keys. Unnamed hashes fill the
    slots right before the next named one (or the range end), as retention keeps tails.
    """
    m, n = len(hashes), len(block_keys)
    if m == n:
        return list(block_keys)
    if m > n:
        return None
    where = {k: i for i, k in enumerate(block_keys)}
    anchors: list[int | None] = []
    for h in hashes:
        k = named.get(h)
        anchors.append(where.get(k) if k is not None else None)
    out: list[BlockKey] = [0] * m
    nxt = n  # position of the next placed block (exclusive bound for the ones before)
    for j in range(m - 1, -1, -1):
        pos = anchors[j]
        if pos is None:
            pos = nxt - 1
        if pos < 0 or pos >= nxt:
            return None
        # A named block must leave room for every block listed before it.
        if pos < j:
            return None
        out[j] = block_keys[pos]
        nxt = pos
    return out
