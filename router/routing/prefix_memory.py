"""Prefix keys at a fixed token granularity: predicted placements and hot prefixes.

Split from :mod:`router.routing.state` (which re-exports it): the router's short-lived
memory of where it sent each prefix, and the sliding window that spots shared prefixes.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Sequence


class PrefixMemory:
    """Prefix keys at a fixed token granularity: predictions and popularity.

    Keys chain Python's tuple hash over ``block_tokens``-token chunks (ints hash the same
    in every process), far cheaper than the engines' sha256: they only need to be stable
    inside this router.
    """

    def __init__(
        self,
        block_tokens: int = 64,
        predict_ttl: float = 3.0,
        hot_window: int = 256,
        hot_min_requests: int = 16,
        hot_max_blocks: int = 64,
    ) -> None:
        if block_tokens <= 0:
            raise ValueError("block_tokens must be positive")
        self.block_tokens = block_tokens
        self.predict_ttl = predict_ttl
        self.hot_min_requests = hot_min_requests
        self.hot_max_blocks = hot_max_blocks
        self._predicted: dict[int, tuple[str, float]] = {}
        self._expiry: deque[tuple[float, list[int]]] = deque()
        self._window: deque[list[int]] = deque(maxlen=max(1, hot_window))
        self._counts: Counter[int] = Counter()

    def keys(self, token_ids: Sequence[int]) -> list[int]:
        g = self.block_tokens
        out: list[int] = []
        parent = 0
        for start in range(0, len(token_ids) - g + 1, g):
            parent = hash((parent, tuple(token_ids[start : start + g])))
            out.append(parent)
        return out

    def predicted(self, keys: Sequence[int], now: float) -> dict[str, int]:
        """Worker -> tokens of the longest live predicted prefix routed there."""
        best: dict[str, int] = {}
        for i, key in enumerate(keys):
            entry = self._predicted.get(key)
            if entry is None or entry[1] <= now:
                break
            best[entry[0]] = (i + 1) * self.block_tokens
        return best

    def remember(self, keys: Sequence[int], worker_id: str, now: float) -> None:
        expires = now + self.predict_ttl
        entry = (worker_id, expires)
        self._predicted.update(dict.fromkeys(keys, entry))
        # One expiry record per request, not per key: expiry cost stays per request.
        self._expiry.append((expires, list(keys)))

    def expire(self, now: float) -> None:
        while self._expiry and self._expiry[0][0] <= now:
            expires, keys = self._expiry.popleft()
            predicted = self._predicted
            for key in keys:
                entry = predicted.get(key)
                if entry is not None and entry[1] == expires:
                    del predicted[key]

    @property
    def predicted_entries(self) -> int:
        return len(self._predicted)

    def hot_tokens(self, keys: Sequence[int], fraction: float) -> int:
        """Length of the longest prefix shared by ``fraction`` of the recent requests."""
        n = len(self._window)
        if n < self.hot_min_requests:
            return 0
        need = fraction * n
        hot = 0
        for i, key in enumerate(keys[: self.hot_max_blocks]):
            if self._counts[key] < need:
                break
            hot = (i + 1) * self.block_tokens
        return hot

    def observe(self, keys: Sequence[int]) -> None:
        if len(self._window) == self._window.maxlen:
            for key in self._window[0]:
                left = self._counts[key] - 1
                if left:
                    self._counts[key] = left
                else:
                    del self._counts[key]
        head = list(keys[: self.hot_max_blocks])
        self._window.append(head)
        self._counts.update(head)
