"""The Redis index: shared by router replicas, survives router restarts.

Why Lua: a batch is applied by one script call (one round trip, atomic, idempotent under
retries) and a score reads every worker's membership with one script call
(``router.index.redis_read``). Layout: inverted -- per (group, block key) the holders'
slots and media masks (``router.index.redis_lua``) -- so a score reads one field per
request block and group, flat in the worker count. Cluster:
``redis+cluster://host:port`` (any node); workers spread over 16 shards, each one hash
tag ``{ix:<n>}`` holding its workers' keys and the rows they share, so no script crosses
slots and a score sends one call per node (docs/benchmarks.md, "Round 3: Redis": the
tags and their balance). Encodings: ``router.index.redis_codec``.
Engine hash -> key lookups needed *before* a batch go through a bounded local cache,
one ``HMGET`` for misses (no round trip when none), valid across replicas by a per-worker
epoch that every ``APPLY`` checks atomically (``router.index.redis_cache``).

Connection errors and timeouts (short by default) become ``IndexUnavailable``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError
from redis.exceptions import TimeoutError as RedisTimeoutError

from router.index import redis_lua, redis_lua_read
from router.index.base import (
    BIT_MEDIA,
    ApplyResult,
    BlockKey,
    EngineHash,
    GroupMeta,
    IndexUnavailable,
    Op,
    WorkerState,
)
from router.index.memory import GHOST_ENTRIES
from router.index.redis_cache import MappingCache
from router.index.redis_codec import (
    INDEX_PREFIX,
    Learned,
    State,
    count_and_map_keys,
    encode_hash,
    encode_hashes,
    index_prefix,
    key_blob,
    new_epoch,
    plan_of,
    shard_of,
    state_dec,
    state_enc,
    worker_prefix,
)
from router.index.redis_meta import MetaCache
from router.index.redis_read import RedisReads
from router.index.redis_stream import StaleMappings, encoded_calls, read_replies, stream_evalsha

__all__ = [
    "RedisIndex",
    "StaleMappings",
    "encode_hash",
    "encode_hashes",
    "key_blob",
    "worker_prefix",
]

WORKERS_KEY = INDEX_PREFIX + "workers"
# Workers registered over REST (JSON specs): replicas and restarted routers share them.
REGISTRATIONS_KEY = INDEX_PREFIX + "registrations"
# Per shard (``X = index_prefix(shard)``): X..'state' worker -> msgpack metadata,
# X..'plan' worker -> "g,bs,full;...", X..'slot' worker -> its slot in the shard's rows,
# X..'ver' grows with every metadata or slot change, never reused (``redis_lua_lib``).
STATE_KEY = INDEX_PREFIX + "state"  # shard 0's (the only shard on a single server)
SLOT_KEY = INDEX_PREFIX + "slot"
# Shards on a cluster: workers spread over this many hash tags (slots), so over the
# nodes; a score reads every shard holding asked-about workers, one call per node.
CLUSTER_SHARDS = 16
_DOWN = (RedisConnectionError, RedisTimeoutError, OSError)
_T = TypeVar("_T")
CLUSTER_SCHEMES = ("redis+cluster://", "rediss+cluster://")


class RedisIndex(RedisReads):
    """redis-py asyncio backend; see the module docstring for the why."""

    kind = "redis"

    def __init__(
        self,
        url: str,
        *,
        socket_timeout: float = 2.0,
        connect_timeout: float = 1.0,
        cache_entries: int = 1_000_000,
        ghost_entries: int = GHOST_ENTRIES,
        shards: int | None = None,
    ) -> None:
        self.url = url
        self._ghost_cap = ghost_entries
        # ``redis+cluster://host:port``: a Redis Cluster reached through any of its nodes.
        self.cluster = url.startswith(CLUSTER_SCHEMES)
        # Every router sharing one Redis must use the same number (it places workers).
        self.shards = shards or (CLUSTER_SHARDS if self.cluster else 1)
        opts: dict[str, Any] = {
            "socket_timeout": socket_timeout,
            "socket_connect_timeout": connect_timeout,
            "retry": Retry(NoBackoff(), 1),
            "decode_responses": False,
        }
        self._r: Any
        if self.cluster:
            self._r = RedisCluster.from_url(url.replace("+cluster", "", 1), **opts)
        else:
            self._r = aioredis.Redis.from_url(url, **opts)
        self._sha: dict[str, str] = {}
        self._mappings = MappingCache(cache_entries)
        self._meta = [MetaCache() for _ in range(self.shards)]
        self._shard_memo = {}

    # -- plumbing -----------------------------------------------------------------------

    async def _call(self, fn: Callable[[], Awaitable[_T]]) -> _T:
        try:
            return await fn()
        except _DOWN as exc:
            raise IndexUnavailable(f"redis at {self.url} unavailable: {exc}") from exc

    async def _script_sha(self, name: str, reload: bool = False) -> str:
        if reload or name not in self._sha:
            source = getattr(redis_lua_read if name == "FETCH" else redis_lua, name)
            self._sha[name] = await self._r.script_load(source)
        return self._sha[name]

    async def _eval(self, name: str, keys: list[str], args: list[Any]) -> Any:
        async def run() -> Any:
            try:
                return await self._r.evalsha(await self._script_sha(name), len(keys), *keys, *args)
            except NoScriptError:  # Redis restarted or SCRIPT FLUSH
                sha = await self._script_sha(name, reload=True)
                return await self._r.evalsha(sha, len(keys), *keys, *args)

        return await self._call(run)

    # -- IndexBackend -------------------------------------------------------------------

    async def ping(self) -> bool:
        try:
            return bool(await self._r.ping())
        except _DOWN:
            return False

    async def close(self) -> None:
        await self._r.aclose()

    async def stats(self) -> dict[str, int | float | str]:
        workers = await self.known_workers()

        async def collect() -> tuple[int, int, int]:
            pipe = self._r.pipeline(transaction=False)
            for w in workers:
                pipe.smembers(self._prefix(w) + "keys")
            counts, maps = count_and_map_keys(
                [self._prefix(w) for w in workers], await pipe.execute()
            )
            names = [*counts, *maps]
            pipe = self._r.pipeline(transaction=False)
            for n in counts:
                pipe.hget(n, "k")
            for n in maps:
                pipe.hlen(n)
            got = await pipe.execute() if names else []
            entries = sum(int(c or 0) for c in got[: len(counts)])
            map_entries = sum(got[len(counts) :])
            opts = {"target_nodes": RedisCluster.PRIMARIES} if self.cluster else {}
            info = await self._r.info("memory", **opts)
            if "used_memory" in info:
                used = int(info["used_memory"])
            else:  # a cluster answers per node
                used = sum(int(node["used_memory"]) for node in info.values())
            return entries, map_entries, used

        entries, map_entries, used = await self._call(collect)
        return {
            "backend": self.kind,
            "workers": len(workers),
            "entries": entries,
            "map_entries": map_entries,
            "bytes": used,
            "bytes_per_entry": round(used / entries, 1) if entries else 0.0,
        }

    async def load_worker(self, worker_id: str) -> WorkerState | None:
        x = self._x(worker_id)
        raw = await self._call(lambda: self._r.hget(x + "state", worker_id))
        if raw is None:
            return None
        return state_dec.decode(raw).worker_state()

    async def save_worker(self, worker_id: str, state: WorkerState) -> None:
        blob = state_enc.encode(
            State(state.hash_mode, state.groups, state.hash_unit, state.settings)
        )
        meta = self._prefix(worker_id) + "meta"
        x = self._x(worker_id)
        epoch = new_epoch()

        async def run() -> None:
            # On a cluster the worker set may live in another slot: no MULTI across it
            # (it is only read to list workers).
            pipe = self._r.pipeline(transaction=not self.cluster)
            pipe.hset(x + "state", worker_id, blob)
            pipe.hset(x + "plan", worker_id, plan_of(state.groups))
            pipe.hsetnx(meta, "epoch", epoch)  # a new worker (or one re-created)
            pipe.execute_command("EVAL", redis_lua.BUMP, 1, x + "ver")  # stale caches
            pipe.sadd(WORKERS_KEY, worker_id)
            if (await pipe.execute())[2]:  # APPLY checks the epoch this process knows
                self._mappings.check_epoch(worker_id, str(epoch).encode())

        await self._call(run)

    async def known_workers(self) -> list[str]:
        members = await self._call(lambda: self._r.smembers(WORKERS_KEY))
        return sorted(m.decode() for m in members)

    async def resolve(
        self,
        worker_id: str,
        block_size: int,
        hashes: Sequence[EngineHash],
        *,
        live_only: bool = False,
    ) -> list[BlockKey | None]:
        if live_only:  # the server's map only: the local cache may hold removed blocks
            name = f"{self._prefix(worker_id)}e:{block_size}"
            fields_ = [encode_hash(h) for h in hashes]
            got = await self._call(lambda: self._r.hmget(name, fields_))
            return [int.from_bytes(v, "big") if v else None for v in got]
        cache = self._mappings.get(worker_id, block_size)
        out = [cache.get(h) for h in hashes]
        misses = [h for h, k in zip(hashes, out, strict=True) if k is None]
        prefix = self._prefix(worker_id)
        if not misses:
            # No round trip: APPLY checks the epoch these were learned in (apply_many).
            return out
        fields = [encode_hash(h) for h in misses]

        async def run() -> list[Any]:
            pipe = self._r.pipeline(transaction=False)
            pipe.hget(prefix + "meta", "epoch")  # are the cached mappings still valid?
            for table in ("e", "t", "u"):  # the map, then newer and older ghosts
                pipe.hmget(f"{prefix}{table}:{block_size}", fields)
            return await pipe.execute()

        got = await self._call(run)
        if not self._mappings.check_epoch(worker_id, got[0]) and len(misses) < len(hashes):
            # Another replica cleared or re-created the worker: the hits were stale.
            return await self.resolve(worker_id, block_size, hashes)
        live, newer, older = got[1:]
        found = {
            h: int.from_bytes(a or b or c, "big")
            for h, a, b, c in zip(misses, live, newer, older, strict=True)
            if a or b or c
        }
        if found:
            self._mappings.remember(worker_id, block_size, found)
        return [k if k is not None else found.get(h) for h, k in zip(hashes, out, strict=True)]

    async def apply(
        self, worker_id: str, groups: dict[int, GroupMeta], ops: Sequence[Op]
    ) -> ApplyResult:
        return (await self.apply_many([(worker_id, groups, ops)]))[0]

    async def apply_many(
        self, items: Sequence[tuple[str, dict[int, GroupMeta], Sequence[Op]]]
    ) -> list[ApplyResult]:
        # Mappings are cached only once Redis took the write (router.index.redis_stream).
        learned: list[Learned] = []
        sha = await self._call(lambda: self._script_sha("APPLY"))

        def encode() -> Any:
            return encoded_calls(items, self._mappings, self._ghost_cap, self.shards, learned)

        calls = encode()
        if self.cluster:  # a pipeline routes each call to its slot's node
            calls = list(calls)

        async def run() -> list[Any]:
            if not self.cluster:  # each call goes out as soon as it is encoded
                return await stream_evalsha(self._r, sha, calls)
            pipe = self._r.pipeline(transaction=False)
            for key, args in calls:
                # execute_command: redis-py blocks the evalsha helper in cluster pipelines
                pipe.execute_command("EVALSHA", sha, 1, key, *args)
            return await pipe.execute(raise_on_error=False)

        replies = await self._call(run)
        if any(isinstance(got, NoScriptError) for got in replies):
            # Redis restarted or SCRIPT FLUSH: nothing ran (every call names the script).
            sha = await self._call(lambda: self._script_sha("APPLY", reload=True))
            learned.clear()
            calls = list(encode())
            replies = await self._call(run)
        return read_replies(items, replies, learned, self._mappings)

    async def clear_worker(self, worker_id: str) -> None:
        self._mappings.forget(worker_id)
        prefix = self._prefix(worker_id)
        x = self._x(worker_id)
        # The recorded seqs go in the same call: a live batch another replica wrote
        # between two calls would otherwise be applied, then forgotten.
        args = [prefix, self._ghost_cap, x, worker_id, f"3 {new_epoch()} 1".encode()]
        got = await self._eval("APPLY", [prefix + "keys"], args)
        self._mappings.check_epoch(worker_id, got[5])

    async def save_registration(self, worker_id: str, spec: bytes) -> None:
        await self._call(lambda: self._r.hset(REGISTRATIONS_KEY, worker_id, spec))

    async def delete_registration(self, worker_id: str) -> None:
        await self._call(lambda: self._r.hdel(REGISTRATIONS_KEY, worker_id))

    async def load_registrations(self) -> dict[str, bytes]:
        raw = await self._call(lambda: self._r.hgetall(REGISTRATIONS_KEY))
        return {k.decode(): bytes(v) for k, v in raw.items()}

    async def load_seqs(self, worker_id: str) -> dict[int, tuple[int, int]]:
        raw = await self._call(lambda: self._r.hgetall(self._prefix(worker_id) + "s"))
        out: dict[int, tuple[int, int]] = {}
        for rank, value in raw.items():
            seq, _, fp = value.partition(b":")
            out[int(rank)] = (int(seq), int(fp or 0))
        return out

    async def remove_worker(self, worker_id: str) -> None:
        await self.clear_worker(worker_id)

        x = self._x(worker_id)

        async def run() -> None:
            pipe = self._r.pipeline(transaction=not self.cluster)
            pipe.execute_command("UNLINK", self._prefix(worker_id) + "meta")  # cluster-safe
            pipe.hdel(x + "state", worker_id)
            pipe.hdel(x + "plan", worker_id)
            pipe.srem(WORKERS_KEY, worker_id)
            pipe.execute_command("EVAL", redis_lua.BUMP, 1, x + "ver")  # max(+1, clock)
            await pipe.execute()

        await self._call(run)
        self._mappings.drop(worker_id)  # its epoch went with its meta
        # Its rows were left by the clear: the slot can go to a new worker.
        await self._eval("FREE", [x + "slot"], [x, worker_id])

    async def group_counts(self, worker_id: str) -> dict[int, dict[str, int]]:
        state = await self.load_worker(worker_id)
        if state is None or not state.groups:
            return {}
        prefix = self._prefix(worker_id)
        order = sorted(state.groups)

        async def run() -> list[Any]:
            pipe = self._r.pipeline(transaction=False)
            for g in order:
                pipe.hgetall(f"{prefix}n:{g}")
            return await pipe.execute()

        out: dict[int, dict[str, int]] = {}
        for g, raw in zip(order, await self._call(run), strict=True):
            counts = {int(k): int(v) for k, v in raw.items() if k != b"k"}
            out[g] = {m: counts[b] for b, m in BIT_MEDIA if counts.get(b)}
        return out

    def _x(self, worker_id: str) -> str:
        """The worker's shard prefix."""
        return index_prefix(shard_of(worker_id, self.shards))

    def _prefix(self, worker_id: str) -> str:
        return worker_prefix(worker_id, self.shards)
