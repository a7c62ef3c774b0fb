"""The memory index's cached write calls (``Worker.fast``, ``Worker.fast_remove``) against
what the uncached loops do: a removal cached before a sibling group's table existed must
not keep deciding with the empty stand-in it was given then."""

from __future__ import annotations

import pytest

from router import native
from router.index.base import GPU_BIT, GroupMeta, RemoveOp, StoreOp
from router.index.memory import MemoryIndex

GROUPS = {
    0: GroupMeta("full_attention", 16),
    1: GroupMeta("sliding_window", 16, 64),
}


@pytest.mark.parametrize("active", [True, False])
async def test_a_removal_sees_a_sibling_table_made_after_it(active: bool) -> None:
    if active and not native.available():
        pytest.skip("compiled core not built")
    before = native.ACTIVE != "python"
    native.set_active(active)
    try:
        index = MemoryIndex()
        hashes, keys = [11, 12], [101, 102]
        # Group 0 only: a removal while group 1 has no table yet (twice: the second
        # would take a cached call).
        await index.apply("w", GROUPS, [StoreOp(0, GPU_BIT, [10], [100])])
        await index.apply("w", GROUPS, [RemoveOp(0, GPU_BIT, [10])])
        await index.apply("w", GROUPS, [RemoveOp(0, GPU_BIT, [10])])
        # Now both groups hold the blocks; group 0 lets go: group 1 still names them.
        ops = [StoreOp(0, GPU_BIT, hashes, keys), StoreOp(1, GPU_BIT, hashes, keys)]
        await index.apply("w", GROUPS, ops)
        res = await index.apply("w", GROUPS, [RemoveOp(0, GPU_BIT, hashes)])
        assert res.removed == 2
        assert await index.resolve("w", 16, hashes, live_only=True) == keys
        # And once group 1 lets go as well, the mappings leave the live map.
        await index.apply("w", GROUPS, [RemoveOp(1, GPU_BIT, hashes)])
        assert await index.resolve("w", 16, hashes, live_only=True) == [None, None]
        assert await index.resolve("w", 16, hashes) == keys  # ghosts name them
    finally:
        native.set_active(before)
