"""A batch's seq is recorded in Redis only with the batch's writes (docs/reliability.md:
"an index write fails ... the batch's seq is not recorded").

Redis does not roll back a script that fails midway: whatever the ``APPLY`` script wrote
before the error stays. It used to note the batch's seq first, so a write that then
failed (a wrong-typed key) left the batch marked applied without its blocks, and every
replica sharing the index skipped it for good. Two real router cores (index, ingestor,
scorer) on one real redis-server; the fault is a real wrong-typed key.
"""

from __future__ import annotations

import pytest
import redis
from _kv_streams import EventSource, Harness, new_index, tokens, wire
from redis.exceptions import ResponseError

from router.index.redis import worker_prefix
from router.index.redis_codec import index_prefix

W = "w1"
BS = 16


async def test_a_failed_write_records_no_seq_and_applies_once_repaired(redis_url: str) -> None:
    replicas = [Harness.build(new_index("redis", redis_url)) for _ in range(2)]
    first, other = replicas
    client = redis.Redis.from_url(redis_url)
    seqs = worker_prefix(W) + "s"
    row = index_prefix(0) + "x:0"  # group 0's shared rows
    src = EventSource()
    toks = tokens(4 * BS + 1)
    try:
        await first.ingestor.apply_batch(W, wire(src.store(toks, BS, 0, 2)), [(0, 0, 0, 11)])
        assert client.hget(seqs, "0") == b"0:11"
        # The rows' key is replaced by a string: the next store fails with WRONGTYPE.
        client.rename(row, row + ":away")
        client.set(row, "not a hash")
        batch = wire(src.store(toks, BS, 2, 4))
        with pytest.raises(ResponseError, match="WRONGTYPE"):
            await first.ingestor.apply_batch(W, batch, [(0, 0, 1, 12)])
        assert client.hget(seqs, "0") == b"0:11"  # not recorded: the blocks are not there

        client.delete(row)
        client.rename(row + ":away", row)
        await other.ingestor.apply_batch(W, batch, [(0, 0, 1, 12)])  # the other replica
        assert other.ingestor.counters.batches_skipped == 0  # applied, not skipped
        await first.ingestor.apply_batch(W, batch, [(0, 0, 1, 12)])  # the retry
        assert first.ingestor.counters.batches_skipped == 1  # now it is a duplicate
        assert client.hget(seqs, "0") == b"1:12"
        for h in replicas:
            assert (await h.one(toks, W)).hit_tokens == 4 * BS
        keys = await first.index.resolve(W, BS, src.hashes(toks, BS))
        assert None not in keys
        # One copy of each block: the batch was applied once.
        assert await first.index.copies(W, 0, [k for k in keys if k is not None]) == [1] * 4
    finally:
        for h in replicas:
            await h.index.close()


async def test_batches_merged_into_one_call_are_checked_against_each_other(
    redis_url: str,
) -> None:
    """Seqs are written once the call's writes are done, so a batch merged after another
    of its rank is checked against that one, not against what Redis held before."""
    h = Harness.build(new_index("redis", redis_url))
    client = redis.Redis.from_url(redis_url)
    src = EventSource()
    toks = tokens(4 * BS + 1)
    store = src.store(toks, BS, 0, 4)
    try:
        # seq 5 of rank 0 twice (the second a duplicate: its store is not applied), and
        # seq 7 of rank 1.
        merged = wire(store, store, src.store(toks, BS, 0, 2))
        await h.ingestor.apply_batch(W, merged, [(0, 0, 5, 1), (1, 0, 5, 1), (2, 1, 7, 2)])
        assert h.ingestor.counters.batches_skipped == 1
        assert client.hgetall(worker_prefix(W) + "s") == {b"0": b"5:1", b"1": b"7:2"}
        keys = await h.index.resolve(W, BS, src.hashes(toks, BS))
        assert await h.index.copies(W, 0, [k for k in keys if k is not None]) == [2, 2, 1, 1]
    finally:
        await h.index.close()
