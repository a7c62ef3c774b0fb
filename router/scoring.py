"""Read side: HMA-exact per-worker scores for a request. (facade; filling in)"""

from __future__ import annotations

from router.index.base import IndexBackend
from schemas.rest import ScoreResponse

DEFAULT_TIER_WEIGHTS = {"GPU": 1.0, "CPU": 0.8, "STORAGE": 0.5}


class Scorer:
    def __init__(
        self, index: IndexBackend, *, tier_weights: dict[str, float] | None = None
    ) -> None:
        self.index = index
        self.tier_weights = {**DEFAULT_TIER_WEIGHTS, **(tier_weights or {})}

    async def score(
        self,
        token_ids: list[int],
        worker_ids: list[str],
        *,
        lora_name: str | None = None,
        cache_salt: str | None = None,
    ) -> ScoreResponse:
        raise NotImplementedError
