"""The Redis index's write stream: a batch's ``APPLY`` calls go out as each is encoded.

Split from ``router.index.redis``. Why: the client's encoding and the server's script
ran in series (encode every call, send them as one pipeline, wait); with the first call
sent at once and the rest in ~16 KB writes, the server runs the first calls while the
client encodes the next, so the stream's wall time tends to the larger of the two
instead of their sum. The RESP is packed here (a join: the arguments are bytes), not by
redis-py's general packer. One connection and one reply per call, read in order after
the last is sent: a worker's batches run in the order given, each one script (atomic
with its ``SeqOp``).

Epochs (``router.index.redis_cache``): every call of a worker carries the epochs its
plan may have been made under -- the cache's at the start of the stream, plus the epoch
of each clear of the worker in an earlier call of the same stream (the clear ran, or its
batch was skipped by seq because another replica applied it, and the epoch stayed). An
epoch is a fresh random token that never comes back, so if a call is refused
(``StaleMappings``) the server's epoch is none of its list, and none of the worker's
later calls in the stream is taken either (their lists only add clears that never ran):
no batch applies ahead of the refused one's replan.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from redis.exceptions import ResponseError

from router.index.base import ApplyResult, GroupMeta, IndexUnavailable, Op
from router.index.redis_cache import MappingCache
from router.index.redis_codec import Learned, apply_args, worker_prefix

Item = tuple[str, dict[int, GroupMeta], Sequence[Op]]


def encoded_calls(
    items: Sequence[Item],
    cache: MappingCache,
    ghost_cap: int,
    shards: int,
    learned: list[Learned],
) -> Iterator[tuple[str, list[Any]]]:
    """(key, arguments) of each item's ``APPLY``, encoded lazily (the stream sends one
    before it encodes the next). Each call expects the epochs its plan may have been
    made under (see the module docstring): the cache's, and the epoch of each clear of
    the worker earlier in this stream (that clear ran, or its batch was skipped by seq
    and the epoch is still the one before it)."""
    expect: dict[str, list[bytes]] = {}
    for w, groups, ops in items:
        if w not in expect:
            epoch = cache.epoch(w)
            expect[w] = [epoch] if epoch is not None else []
        clears: dict[str, bytes] = {}
        args = apply_args(w, ghost_cap, groups, ops, learned, cache, shards, clears)
        if expect[w]:
            args.insert(4, b"5 " + b" ".join(expect[w]))
        if w in clears:
            expect[w] = [*expect[w], clears[w]]
        yield worker_prefix(w, shards) + "keys", args


FLUSH_BYTES = 16_384  # send when this much is buffered (and the first call at once)


def pack_evalsha(sha: bytes, key: bytes, args: Sequence[Any]) -> bytes:
    """``EVALSHA sha 1 key *args`` in RESP: the arguments are bytes, str or int here, so
    this is a join, not redis-py's general packer (a third of the client's ingest CPU)."""
    out = [b"*%d\r\n$7\r\nEVALSHA\r\n$40\r\n%s\r\n$1\r\n1\r\n$%d\r\n%s\r\n" % (
        len(args) + 4, sha, len(key), key)]  # fmt: skip
    for a in args:
        if not isinstance(a, bytes):
            a = a.encode() if isinstance(a, str) else b"%d" % a
        out.append(b"$%d\r\n" % len(a))
        out.append(a)
        out.append(b"\r\n")
    return b"".join(out)


async def stream_evalsha(r: Any, sha: str, calls: Iterable[tuple[str, list[Any]]]) -> list[Any]:
    """``EVALSHA sha 1 key *args`` per call on one pooled connection, the first written
    at once and the rest as ~16 KB accumulate (a send per call would cost the client a
    syscall each), so the server starts while the client encodes; the replies in order
    (a script error as its exception, like a pipeline's). Written with redis-py's
    ``send_packed_command`` (its socket timeout and error mapping). A failure mid-stream
    drops the connection (replies would be out of step) and raises."""
    pool = r.connection_pool
    conn = await pool.get_connection()
    sha_b = sha.encode()
    try:
        sent, buf, size = 0, [], 0
        for key, args in calls:
            packed = pack_evalsha(sha_b, key.encode(), args)
            buf.append(packed)
            size += len(packed)
            sent += 1
            if sent == 1 or size >= FLUSH_BYTES:
                await conn.send_packed_command(buf, check_health=False)
                buf, size = [], 0
        if buf:
            await conn.send_packed_command(buf, check_health=False)
        replies: list[Any] = []
        for _ in range(sent):
            try:
                replies.append(await conn.read_response())
            except ResponseError as exc:
                replies.append(exc)
        return replies
    except BaseException:
        await conn.disconnect(nowait=True)
        raise
    finally:
        await pool.release(conn)


class StaleMappings(IndexUnavailable):
    """A batch was planned from cached mappings another router has voided (it cleared or
    re-created the worker) and nothing of it was written: the writer retries, and the
    new plan asks Redis (``IndexRetry``)."""


def read_replies(
    items: Sequence[tuple[str, Any, Any]],
    replies: Sequence[Any],
    learned: list[Learned],
    mappings: MappingCache,
) -> list[ApplyResult]:
    """The ``APPLY`` replies of a stream (format: ``router.index.redis_lua``): epochs
    checked, the mappings learned cached once Redis took their write, each call's
    result; ``StaleMappings`` if a call was refused."""
    for got in replies:
        if isinstance(got, Exception):
            raise got
    stale = set()
    for (worker_id, _, _), got in zip(items, replies, strict=True):
        mappings.check_epoch(worker_id, got[5] or None if len(got) > 5 else None)
        if len(got) > 6 and int(got[6]):  # refused: planned under a replaced epoch
            stale.add(worker_id)
    for worker_id, bs, hashes, keys in learned:
        if worker_id not in stale:
            mappings.remember_lists(worker_id, bs, hashes, keys)
    if stale:
        # The other workers' writes went through; a retry skips them by their seqs.
        raise StaleMappings(f"workers {sorted(stale)} changed by another router: replan")
    return [ApplyResult(*(int(got[i]) for i in (0, 1, 2, 3, 4, 7, 8))) for got in replies]
