"""Waiting partial entries (``router.ingest.partials``): what the scorer can see of
them, and what counts as lost."""

from __future__ import annotations

from _kv_streams import new_index, tokens

from router.index.base import CPU_BIT, GPU_BIT
from router.ingest.counters import IngestCounters
from router.ingest.ingestor import Ingestor
from router.ingest.partials import PendingPartials, active_workers, waiting_partials
from schemas import BlockStored

UNIT = 16


def _partial(h: int, toks: list[int], extra: list | None = None) -> BlockStored:
    return BlockStored(
        block_hashes=[h],
        parent_block_hash=h + 1000,
        token_ids=toks,
        block_size=UNIT,
        lora_id=None,
        medium="GPU",
        lora_name=None,
        extra_keys=extra,
    )


def test_every_ingestor_of_an_index_is_visible_to_its_scorers() -> None:
    """Two ingestors (replicas' subscribers) on one index: both tables are found; an
    ingestor of another index is not, and a worker without waiting copies yields none."""
    index, other = new_index("memory", None), new_index("memory", None)
    a, b, c = Ingestor(index), Ingestor(index), Ingestor(other)
    toks = tokens(UNIT)
    a._pending("w").add(0, GPU_BIT, _partial(11, toks), [11], UNIT)
    b._pending("w").add(1, CPU_BIT, _partial(12, toks), [12], UNIT)
    c._pending("w").add(0, GPU_BIT, _partial(13, toks), [13], UNIT)
    b._pending("idle")
    got = list(waiting_partials(index, "w"))
    assert [t.slots(11) for t in got] == [{(0, GPU_BIT): 1}, None]
    assert [t.slots(12) for t in got] == [None, {(1, CPU_BIT): 1}]
    assert all(t.slots(13) is None for t in got)
    assert list(waiting_partials(index, "idle")) == []
    # Scorers check this first: workers with a non-empty table, counted per table.
    assert active_workers(index) == {"w": 2} and active_workers(other) == {"w": 1}
    assert a._pending("w").take_removed(0, GPU_BIT, [11]) == []
    b._pending("w").clear()
    assert active_workers(index) == {}
    assert list(waiting_partials(index, "w")) == []


def test_only_copies_pushed_out_by_the_bound_are_lost() -> None:
    counters = IngestCounters()
    table = PendingPartials(counters, cap=2)
    toks = tokens(UNIT)
    for h in (1, 2, 3):
        table.add(0, GPU_BIT, _partial(h, toks), [h], UNIT)
    assert counters.partial_unknown_prefix == 1  # hash 1, the oldest
    assert table.slots(1) is None and table.slots(3) == {(0, GPU_BIT): 1}
    assert table.take_removed(0, GPU_BIT, [2, 7]) == [7]  # 7: the index's to remove
    table.clear()
    assert counters.partial_unknown_prefix == 1 and len(table) == 0


def test_lora_keys_and_the_unit_are_learned_from_the_entries() -> None:
    """The engine hashes an adapter's path, the router is told its name: the entry's
    extra keys say which path; a new hash unit drops what was stored at the old one."""
    table = PendingPartials(IngestCounters())
    toks = tokens(UNIT)
    table.add(0, GPU_BIT, _partial(1, toks, [[["lora", "a", "/p/a"]]]), [1], UNIT)
    assert table.unit == UNIT and table.lora_keys == {"a": ("lora", "a", "/p/a")}
    table.add(0, GPU_BIT, _partial(2, toks[:8]), [2], 8)
    assert table.unit == 8 and table.slots(1) is None and table.slots(2)
