"""In-flight requests per worker: the load the router has dispatched and not seen finish.

Split from :mod:`router.routing.state` (which re-exports it): a request counts as load on
its worker from dispatch until it is finished or its TTL passes (expired lazily, on every
call, in deadline order), with a prefill backlog that drains at an estimated speed or at
first tokens.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass


class DuplicateRequestError(KeyError):
    """A request id that is still in flight was dispatched again."""


@dataclass(slots=True)
class Inflight:
    request_id: str
    worker_id: str
    deadline: float
    prefill_tokens: float
    decode_tokens: float
    tokens: float = 0.0  # prompt tokens (blocks held while it runs)
    dispatched: float = 0.0


@dataclass(slots=True)
class WorkerLoad:
    """A worker's load as the router sees it. ``prefill_backlog`` is the uncached prompt
    tokens dispatched to it that it has not prefilled yet (a fluid estimate)."""

    requests: int = 0
    prefill_backlog: float = 0.0
    decode_tokens: float = 0.0
    updated: float = 0.0
    tokens: float = 0.0


# What ``InflightTable.loads_for`` answers for a worker with nothing in flight.
_IDLE = WorkerLoad()


class InflightTable:
    """In-flight requests per worker, with a TTL so lost finishes cannot leak load.

    Prefill backlog: each dispatch adds its uncached tokens; with ``prefill_tps > 0`` the
    backlog drains at that rate (the router's estimate of a worker's prefill speed), so a
    request that is long past its prefill -- decoding -- stops counting as prefill work
    without the engine telling the router. With ``prefill_tps == 0`` it drains only when
    requests finish. The backlog is zero whenever nothing is in flight.
    """

    def __init__(self, ttl: float = 120.0, prefill_tps: float = 0.0) -> None:
        if ttl <= 0:
            raise ValueError("ttl must be positive")
        if prefill_tps < 0:
            raise ValueError("prefill_tps must be >= 0")
        self.ttl = ttl
        self.prefill_tps = prefill_tps
        self.expired = 0
        self._items: dict[str, Inflight] = {}
        # Per worker, requests whose prefill has not ended, in dispatch order (lazy).
        self._prefilling: dict[str, deque[Inflight]] = {}
        self._loads: dict[str, WorkerLoad] = {}
        self._deadlines: list[tuple[float, str]] = []

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._items

    def _drain(self, load: WorkerLoad, now: float) -> None:
        if self.prefill_tps > 0 and now > load.updated:
            done = (now - load.updated) * self.prefill_tps
            load.prefill_backlog = max(0.0, load.prefill_backlog - done)
            load.updated = now

    def add(
        self,
        request_id: str,
        worker_id: str,
        now: float,
        prefill_tokens: float = 0.0,
        decode_tokens: float = 0.0,
        tokens: float = 0.0,
        expires: bool = True,
    ) -> Inflight:
        """``expires=False``: the caller always finishes it (the proxy, in a ``finally``),
        so the TTL -- a guard against finishes that never come -- must not end it while
        it runs (a generation may outlast any TTL)."""
        if request_id in self._items:
            raise DuplicateRequestError(request_id)
        deadline = now + self.ttl if expires else float("inf")
        item = Inflight(request_id, worker_id, deadline, prefill_tokens, decode_tokens, tokens, now)
        self._items[request_id] = item
        load = self._loads.get(worker_id)
        if load is None:
            load = self._loads[worker_id] = WorkerLoad(updated=now)
        self._drain(load, now)
        load.requests += 1
        load.prefill_backlog += prefill_tokens
        if prefill_tokens > 0:
            self._prefilling.setdefault(worker_id, deque()).append(item)
        load.decode_tokens += decode_tokens
        load.tokens += tokens
        if expires:
            heapq.heappush(self._deadlines, (item.deadline, request_id))
        return item

    def drop_worker(self, worker_id: str) -> int:
        """Forget every request in flight on a removed worker (a worker registered again
        under its id starts idle); returns how many. Their finishes are then unknown."""
        gone = [rid for rid, item in self._items.items() if item.worker_id == worker_id]
        for rid in gone:
            del self._items[rid]
        self._loads.pop(worker_id, None)
        self._prefilling.pop(worker_id, None)
        return len(gone)

    def finish(self, request_id: str) -> Inflight | None:
        """Remove a request; None when it is unknown (never dispatched, or expired)."""
        item = self._items.pop(request_id, None)
        if item is None:
            return None
        self._prune(item.worker_id)
        load = self._loads[item.worker_id]
        load.requests -= 1
        if load.requests == 0:
            del self._loads[item.worker_id]  # also resets float drift
            return item
        load.decode_tokens -= item.decode_tokens
        load.tokens -= item.tokens
        if self.prefill_tps == 0:
            load.prefill_backlog -= item.prefill_tokens
        return item

    def get(self, request_id: str) -> Inflight | None:
        return self._items.get(request_id)

    def first_token(self, request_id: str) -> Inflight | None:
        """Prefill is over (the engine streamed a token): the request's uncached tokens
        leave its worker's backlog now rather than when it finishes."""
        item = self._items.get(request_id)
        if item is None or item.prefill_tokens == 0:
            return item
        load = self._loads[item.worker_id]
        load.prefill_backlog = max(0.0, load.prefill_backlog - item.prefill_tokens)
        item.prefill_tokens = 0.0
        self._prune(item.worker_id)
        return item

    def _in_prefill(self, item: Inflight) -> bool:
        return item.prefill_tokens > 0 and self._items.get(item.request_id) is item

    def _prune(self, worker_id: str) -> deque[Inflight] | None:
        """The worker's prefill queue without the requests at its head that are no longer
        in prefill (first token seen, finished, expired), or None once it is empty. Run on
        every first token and finish, so the queue holds no more than the requests
        dispatched since the oldest one still in prefill (engines prefill FCFS)."""
        queue = self._prefilling.get(worker_id)
        if queue is None:
            return None
        while queue and not self._in_prefill(queue[0]):
            queue.popleft()
        if not queue:
            del self._prefilling[worker_id]
            return None
        return queue

    def prefill_head(self, worker_id: str) -> Inflight | None:
        """The oldest request still in prefill on ``worker_id`` (engines admit FCFS, so it
        is the one being prefilled now), or None."""
        queue = self._prune(worker_id)
        return queue[0] if queue else None

    def prefilling_tokens(self, worker_id: str) -> list[float]:
        """Uncached tokens of each request still in prefill on ``worker_id``, oldest
        first (requests whose first token was reported are gone)."""
        queue = self._prune(worker_id)
        return [it.prefill_tokens for it in queue if self._in_prefill(it)] if queue else []

    def expire(self, now: float) -> int:
        """Drop every request whose deadline has passed; returns how many."""
        n = 0
        while self._deadlines and self._deadlines[0][0] <= now:
            deadline, request_id = heapq.heappop(self._deadlines)
            item = self._items.get(request_id)
            if item is not None and item.deadline == deadline:
                self.finish(request_id)
                n += 1
        self.expired += n
        return n

    def load(self, worker_id: str, now: float | None = None) -> WorkerLoad:
        """A snapshot of the worker's load (backlog drained up to ``now`` when given)."""
        load = self._loads.get(worker_id)
        if load is None:
            return WorkerLoad()
        if now is not None:
            self._drain(load, now)
        return WorkerLoad(
            load.requests, load.prefill_backlog, load.decode_tokens, load.updated, load.tokens
        )

    def loads_for(self, worker_ids: Sequence[str], now: float) -> list[WorkerLoad]:
        """Each worker's live load record, drained up to ``now`` -- one shared all-zero
        record for idle workers (most of a large fleet). Read them, never mutate them:
        unlike :meth:`load` these are not copies (one per worker per request was the
        routing path's largest allocation)."""
        loads = self._loads
        idle = _IDLE
        drain = self.prefill_tps > 0
        out: list[WorkerLoad] = []
        for w in worker_ids:
            load = loads.get(w)
            if load is None:
                out.append(idle)
                continue
            if drain:
                self._drain(load, now)
            out.append(load)
        return out

    def requests_by_worker(self) -> dict[str, int]:
        return {w: load.requests for w, load in self._loads.items()}
