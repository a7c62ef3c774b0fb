"""Cache and queue pressure: how often a cache hit the router could count on was lost
to eviction, and how much prefill work waits on the fleet.

A fair-share term that spreads load is what keeps hits under a tight cache (a busy
worker evicts a conversation's blocks while its next turn waits in the queue), and it
only costs hits where every working set fits (a group of conversations split over two
workers prefills its shared prefix twice, for good). Which regime the fleet is in shows
in one rate the router measures itself, from two kinds of sample:

* a request that extends a prompt the router routed earlier (a conversation's next turn,
  an agent's next step) and finds that prompt no longer cached in full on the worker it
  went to: evicted before this request was routed (the index shows it);
* a request routed with a cache hit whose engine then reports fewer ``cached_tokens``:
  evicted between routing and admission, while it waited in the engine's queue (where
  engines report usage).

Measured on the live benchmark (docs/routing.md): no loss in a roomy fleet, 11-16% of the
checks in a tight one. Where work queues the fair-share term pays for itself whatever
the caches do, so the queue depth (mean prefill backlog per worker, in requests' worth)
opens the same gate.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence


class CachePressure:
    """The fleet's hit-loss rate and queue depth, each exponentially weighted over
    ``window`` samples; 0 until the first one."""

    def __init__(self, window: float = 32.0, remembered: int = 65_536) -> None:
        self.alpha = 1.0 / max(window, 1.0)
        self.remembered = max(1, remembered)
        # Last prefix key of a routed prompt -> (request id, worker).
        self._prompts: dict[int, tuple[str, str]] = {}
        self.loss_rate = 0.0
        self.samples = 0
        self.losses = 0
        self.continuations = 0
        self.continuations_lost = 0
        self.reports = 0
        self.reports_lost = 0
        self.queue_depth = 0.0

    def _sample(self, lost: bool) -> None:
        self.samples += 1
        self.losses += lost
        self.loss_rate += self.alpha * (float(lost) - self.loss_rate)

    def continued(
        self,
        keys: Sequence[int],
        key_tokens: int,
        hit_on: Callable[[str], int | None],
        prefilling: Callable[[str], bool],
    ) -> None:
        """Before routing a request with prefix ``keys``: if it extends a prompt routed
        earlier (the longest such: a conversation's last turn) that has been prefilled,
        learn whether its worker still holds it in full (``hit_on(worker)``: cached
        tokens there now per the index; ``None`` if the worker is gone)."""
        prompts = self._prompts
        # From the second-longest prefix down: a prompt routed before that ends where this
        # one does is this prompt again (a retry, a replayed conversation), not its
        # earlier turn -- after a cache reset it would read as evicted.
        for i in range(len(keys) - 2, -1, -1):
            entry = prompts.get(keys[i])
            if entry is None:
                continue
            request_id, worker = entry
            if prefilling(request_id):
                return  # its prompt may not be stored yet: no evidence either way
            hit = hit_on(worker)
            if hit is None:
                return
            lost = hit < (i + 1) * key_tokens
            self.continuations += 1
            self.continuations_lost += lost
            self._sample(lost)
            return

    def remember(self, keys: Sequence[int], request_id: str, worker_id: str) -> None:
        """The request was routed: a later request extending its prompt is a
        continuation (bounded: the oldest prompts are forgotten first)."""
        if not keys:
            return
        prompts = self._prompts
        prompts[keys[-1]] = (request_id, worker_id)
        if len(prompts) > self.remembered:
            del prompts[next(iter(prompts))]

    def reported(self, expected: int, cached: int) -> None:
        """One request: ``expected`` cached tokens per the index when it was routed,
        ``cached`` as the engine reported at admission. The index's estimate is exact
        (the engine's own rounding and last-token rule included), so any shortfall is
        a hit evicted in between; a request expected to hit nothing says nothing."""
        if expected > 0:
            lost = cached < expected
            self.reports += 1
            self.reports_lost += lost
            self._sample(lost)

    def queued(self, mean_backlog: float, request_tokens: int) -> None:
        """One routed request: the fleet's mean prefill backlog per worker, in units of
        this request's size (how many requests' worth of work waits ahead of it)."""
        depth = mean_backlog / max(request_tokens, 1)
        self.queue_depth += self.alpha * (depth - self.queue_depth)

    def evicting(self, knee: float, queue_knee: float) -> float:
        """0..1: how far the loss rate is towards ``knee`` while work does not queue
        (falling to 0 as the queue depth reaches ``queue_knee``): hits lost to a full
        cache, not to a busy fleet."""
        if knee <= 0 or queue_knee <= 0:
            return 0.0
        calm = max(0.0, 1.0 - self.queue_depth / queue_knee)
        return min(1.0, self.loss_rate / knee) * calm

    def gate(self, knee: float, queue_knee: float = 0.0) -> float:
        """0..1: how far the loss rate is towards ``knee``, or the queue depth towards
        ``queue_knee`` (0: not looked at), whichever is further; 1 at or past either."""
        if knee <= 0:
            return 1.0
        gate = self.loss_rate / knee
        if queue_knee > 0:
            gate = max(gate, self.queue_depth / queue_knee)
        return min(1.0, gate)
