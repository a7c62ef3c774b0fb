"""Per-worker prefill speed, learned from when first tokens come back.

The router knows when it dispatched a request, how many uncached tokens it expected the
worker to prefill, and (from the engine's first streamed token, or the simulator) when
prefill ended. While a worker is busy, the time between one request's first token and
the previous one on that worker is that request's share of the worker's prefill time,
decode interleaving included -- exactly the *effective* rate a placement decision needs.
Tokens and seconds are averaged separately (a ratio of exponential averages), so tiny
prefills (near-full cache hits) cannot drag the estimate down by dividing small numbers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(slots=True)
class _Worker:
    tokens: float = 0.0
    seconds: float = 0.0
    last_first_token: float = float("-inf")
    samples: int = 0


class SpeedEstimator:
    """``speed(w)``: worker ``w``'s effective prefill rate over ``nominal_tps`` (1.0 until
    ``min_samples`` observations have been made)."""

    def __init__(
        self,
        nominal_tps: float,
        alpha: float = 0.05,
        min_tokens: float = 1024.0,
        min_samples: int = 8,
    ) -> None:
        if nominal_tps <= 0:
            raise ValueError("nominal_tps must be positive")
        self.nominal_tps = nominal_tps
        self.alpha = alpha
        self.min_tokens = min_tokens
        self.min_samples = min_samples
        self._workers: dict[str, _Worker] = {}
        # ``relative`` is asked every request and changes only when a speed is learned:
        # its last answer, valid while ``_version`` and the worker list are unchanged.
        self._version = 0
        self._relative: tuple[int, tuple[str, ...], float, dict[str, float]] | None = None

    def observe(self, worker_id: str, dispatched: float, first_token: float, tokens: float) -> None:
        w = self._workers.get(worker_id)
        if w is None:
            w = self._workers[worker_id] = _Worker()
        start = max(dispatched, w.last_first_token)
        w.last_first_token = max(w.last_first_token, first_token)
        elapsed = first_token - start
        if tokens < self.min_tokens or elapsed <= 0:
            return
        a = self.alpha if w.samples else 1.0
        w.tokens += a * (tokens - w.tokens)
        w.seconds += a * (elapsed - w.seconds)
        w.samples += 1
        if w.samples >= self.min_samples:  # below it tps() is nominal: nothing changed
            self._version += 1

    def tps(self, worker_id: str) -> float:
        w = self._workers.get(worker_id)
        if w is None or w.samples < self.min_samples or w.seconds <= 0:
            return self.nominal_tps
        return w.tokens / w.seconds

    def last_first_token(self, worker_id: str) -> float:
        """When the worker last streamed a first token (-inf: never seen)."""
        w = self._workers.get(worker_id)
        return w.last_first_token if w is not None else float("-inf")

    def speed(self, worker_id: str) -> float:
        return self.tps(worker_id) / self.nominal_tps

    def relative(self, worker_ids: Sequence[str], dead_band: float = 0.35) -> dict[str, float]:
        """Each worker's speed over the fleet's mean, clamped to [1/4, 4]; within
        ``dead_band`` of 1.0 it is 1.0 (a homogeneous fleet's sampling noise, and the
        decode interleaving that load already accounts for, must not steer placement).
        The dict is shared between calls until a speed changes: read it, never mutate it."""
        key = tuple(worker_ids)
        cached = self._relative
        if (
            cached is not None
            and cached[0] == self._version
            and cached[2] == dead_band
            and cached[1] == key
        ):
            return cached[3]
        out = self._compute_relative(key, dead_band)
        self._relative = (self._version, key, dead_band, out)
        return out

    def _compute_relative(self, worker_ids: Sequence[str], dead_band: float) -> dict[str, float]:
        tps = [self.tps(w) for w in worker_ids]
        mean = sum(tps) / len(tps) if tps else 1.0
        out: dict[str, float] = {}
        for w, t in zip(worker_ids, tps, strict=True):
            r = min(4.0, max(0.25, t / mean)) if mean > 0 else 1.0
            out[w] = 1.0 if abs(r - 1.0) < dead_band else r
        return out

    def forget(self, worker_id: str) -> None:
        if self._workers.pop(worker_id, None) is not None:
            self._version += 1
