"""Event streams for the router-core tests, built like real engines build them.

``EventSource("engine")`` hashes blocks with ``schemas.hashing`` (vLLM's default
hashing, our engine's extra keys); ``EventSource("foreign")`` gives every block a random
64-bit hash (unknown seed / xxhash / SGLang). Batches go through the real wire encoder and
the safe decoder, so the ingestor sees exactly what a subscriber would.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from _helpers import stored

from router.index import IndexBackend, make_index
from router.index.base import EngineSettings
from router.ingest.ingestor import Ingestor
from router.score.scorer import Scorer
from schemas import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    decode_batch,
    encode_batch,
)
from schemas.hashing import block_extra_keys, block_hashes, external_hash
from schemas.rest import ScoreResponse, WorkerScore


class EventSource:
    """One engine's hashing; produces BlockStored / BlockRemoved for token prefixes."""

    def __init__(self, mode: str = "engine", *, algo: str = "sha256", seed: int = 0) -> None:
        assert mode in ("engine", "foreign")
        self.mode = mode
        self.algo = algo
        self._rng = random.Random(seed)
        self._foreign: dict[tuple[object, ...], int] = {}

    def hashes(
        self,
        tokens: Sequence[int],
        bs: int,
        *,
        salt: str | None = None,
        lora: tuple[str, str] | None = None,
    ) -> list[int]:
        if self.mode == "engine":
            digests = block_hashes(tokens, bs, self.algo, cache_salt=salt, lora=lora)
            return [external_hash(d) for d in digests]
        out = []
        for i in range(len(tokens) // bs):
            key = (bs, salt, lora, tuple(tokens[: (i + 1) * bs]))
            if key not in self._foreign:
                self._foreign[key] = self._rng.getrandbits(64)
            out.append(self._foreign[key])
        return out

    def store(
        self,
        tokens: Sequence[int],
        bs: int,
        start: int,
        stop: int,
        *,
        group: int | None = None,
        kind: str | None = None,
        window: int | None = None,
        medium: str | None = "GPU",
        salt: str | None = None,
        lora: tuple[str, str] | None = None,
        with_tokens: bool = True,
    ) -> BlockStored:
        """Blocks ``[start, stop)`` of ``tokens`` stored, chained like vLLM announces them."""
        hs = self.hashes(tokens[: stop * bs], bs, salt=salt, lora=lora)
        extra = [block_extra_keys(i, salt, lora) for i in range(start, stop)]
        return BlockStored(
            block_hashes=hs[start:stop],
            parent_block_hash=hs[start - 1] if start > 0 and with_tokens else None,
            token_ids=list(tokens[start * bs : stop * bs]) if with_tokens else [],
            block_size=bs,
            lora_id=None,
            medium=medium,
            lora_name=lora[0] if lora else None,
            extra_keys=extra if any(e is not None for e in extra) and with_tokens else None,
            group_idx=group,
            kv_cache_spec_kind=kind,
            kv_cache_spec_sliding_window=window,
        )

    def remove(
        self,
        tokens: Sequence[int],
        bs: int,
        blocks: Iterable[int],
        *,
        group: int | None = None,
        medium: str | None = "GPU",
        salt: str | None = None,
        lora: tuple[str, str] | None = None,
    ) -> BlockRemoved:
        hs = self.hashes(tokens, bs, salt=salt, lora=lora)
        return BlockRemoved(block_hashes=[hs[i] for i in blocks], medium=medium, group_idx=group)


def wire(*events: object, dp_rank: int | None = None) -> KVEventBatch:
    """A batch as a subscriber receives it: encoded by our vLLM-identical encoder, decoded
    by the safe decoder."""
    return decode_batch(encode_batch(KVEventBatch(0.0, list(events), dp_rank)))


def cleared() -> AllBlocksCleared:
    return AllBlocksCleared()


def tokens(n: int, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(1, 50_000) for _ in range(n)]


@dataclass
class Harness:
    """An index with its ingestor and scorer; a test talks to the router core through it."""

    index: IndexBackend
    ingestor: Ingestor
    scorer: Scorer

    @classmethod
    def build(cls, index: IndexBackend, **ingest_opts: object) -> Harness:
        return cls(index, Ingestor(index, **ingest_opts), Scorer(index))  # type: ignore[arg-type]

    async def feed(self, worker: str, *events: object) -> None:
        await self.ingestor.apply_batch(worker, wire(*events))

    async def score(
        self, toks: Sequence[int], workers: Sequence[str], **kw: object
    ) -> ScoreResponse:
        return await self.scorer.score(list(toks), list(workers), **kw)  # type: ignore[arg-type]

    async def one(self, toks: Sequence[int], worker: str, **kw: object) -> WorkerScore:
        return (await self.score(toks, [worker], **kw)).workers[0]


def new_index(kind: str, redis_url: str | None) -> IndexBackend:
    return make_index(kind, redis_url if kind == "redis" else None)


# Report-full (re-announcement) streams: 16-token blocks, SWA window 32.
REPORT_BLOCK = 16
FULL, SWA = "full_attention", "sliding_window"


def store16(
    hashes: list[int], toks: list[int], parent: int | None, group: int = 0, kind: str = FULL
) -> BlockStored:
    """A GPU store of 16-token blocks (a 32-token window for a sliding-window group)."""
    window = 32 if kind == SWA else None
    return stored(
        hashes, toks, parent, block_size=REPORT_BLOCK, group=group, kind=kind, window=window
    )


def gpu_removed(hashes: list[int], group: int = 0) -> BlockRemoved:
    return BlockRemoved(block_hashes=hashes, medium="GPU", group_idx=group)


async def configured_harness(request: Any, **settings: Any) -> Harness:
    """A ``Harness`` on the fixture's backend (``request.param``: "memory" or "redis")
    with worker "w" registered under ``settings`` (``EngineSettings`` fields)."""
    url = request.getfixturevalue("redis_url") if request.param == "redis" else None
    h = Harness.build(new_index(request.param, url))
    await h.ingestor.configure("w", EngineSettings(**settings))
    return h


async def feed_hybrid_fleet(
    harnesses: list[Harness], seed: int, n_workers: int, bs: int = 16, window: int = 48
) -> list[list[int]]:
    """The same random fleet into each harness: workers ``w0..`` holding prefixes of three
    prompts in a full-attention group and a sliding-window group (GPU or CPU), some with
    a window block removed. Shared by the Redis Cluster and Valkey tests."""
    rng = random.Random(seed)
    swa = {"kind": "sliding_window", "window": window}
    prompts = [tokens(12 * bs + 5, seed=seed * 10 + j) for j in range(3)]
    for w in range(n_workers):
        src = EventSource("engine")
        events: list[object] = []
        for toks in prompts:
            if rng.random() < 0.3:
                continue
            stop = rng.randint(1, len(toks) // bs)
            medium = rng.choice(["GPU", "GPU", "CPU"])
            events.append(src.store(toks, bs, 0, stop, group=0, kind="full_attention"))
            events.append(src.store(toks, bs, 0, stop, group=1, medium=medium, **swa))
            if stop > 3 and rng.random() < 0.5:
                events.append(src.remove(toks, bs, [stop - 3], group=1, medium=medium))
        for h in harnesses:
            await h.feed(f"w{w}", *events)
    return prompts
