"""How much of a session's previous turn its engine still holds when the next turn comes.

The routing core's own hit-loss rate (``router.routing.pressure``) is what the router can
see, and it sees different things under different policies: kvroute's policy tracks
continuations through its prefix memory, the anchors only get the engines' admission
reports. Comparing policies needs one yardstick measured the same way for all of them,
from the engines' own caches: for every turn of a session, the prefix it shares with the
session's previous turn (as far as the hit rule could ever serve it), and how much of that
the engine that served the previous turn still holds now, before this turn is routed.
A turn whose previous turn has not finished its prefill is not a sample (its blocks may
not be stored yet).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import takewhile

from offload_core.kv_cache import KVCacheManager
from offload_core.kv_cache import Request as EngineRequest
from schemas.hit_rule import max_candidate


@dataclass(slots=True)
class _Turn:
    request_id: str
    worker: int
    digests: list[bytes]


def common_blocks(a: Sequence[bytes], b: Sequence[bytes]) -> int:
    """Leading block digests two prompts share."""
    return sum(1 for _ in takewhile(lambda pair: pair[0] == pair[1], zip(a, b, strict=False)))


class TurnLoss:
    """Ground truth, per fleet, of previous turns evicted before their session's next turn."""

    def __init__(self, engines: Sequence[KVCacheManager]) -> None:
        self.engines = engines
        self._last: dict[str, _Turn] = {}
        self._prefilled: set[str] = set()
        self.turns = 0  # samples: turns whose previous turn had been prefilled
        self.turns_hit = 0  # of those, turns that found less than they share
        self.shared_tokens = 0  # tokens those turns share with their previous turn
        self.evicted_tokens = 0  # ... that its engine no longer held

    def prefilled(self, request_id: str) -> None:
        """The request's first token came: its prompt is cached on its engine."""
        self._prefilled.add(request_id)

    def check(self, session_id: str, request: EngineRequest) -> None:
        """Before routing a turn of ``session_id``: sample its previous turn's engine."""
        prev = self._last.get(session_id) if session_id else None
        if prev is None or prev.request_id not in self._prefilled:
            return
        kv = self.engines[prev.worker]
        size = kv.groups[0].block_size
        digests = request.hashes[size]
        shared = min(
            common_blocks(prev.digests, digests) * size,
            max_candidate(len(request.token_ids), kv.step),
        )
        if shared <= 0:
            return
        held = min(kv.find_longest_cache_hit(request).hit_tokens, shared)
        self.turns += 1
        self.turns_hit += held < shared
        self.shared_tokens += shared
        self.evicted_tokens += shared - held

    def served(self, session_id: str, request_id: str, worker: int, request: EngineRequest) -> None:
        """The turn went to ``worker``: the next turn of the session is checked there."""
        if not session_id:
            return
        old = self._last.get(session_id)
        if old is not None:
            self._prefilled.discard(old.request_id)
        size = self.engines[worker].groups[0].block_size
        self._last[session_id] = _Turn(request_id, worker, request.hashes[size])

    def summary(self) -> dict[str, float]:
        return {
            "prev_turn_tokens_evicted": round(self.evicted_tokens / max(self.shared_tokens, 1), 4),
            "prev_turns_evicted": round(self.turns_hit / max(self.turns, 1), 4),
            "prev_turn_samples": self.turns,
        }
