"""A :class:`router.bench.sim.Fleet` of charged engines (``router.bench.charged``).

Split from the engine model: the engine says what a step costs and what it did; the fleet
turns that into what the router hears (events, first tokens, finishes, in time order),
routes each request through the real routing core, and keeps the statistics.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from typing import Any

from offload_core.kv_cache import Request as EngineRequest
from router.bench.charged import ChargedEngine, ChargedModel, EngineNotes
from router.bench.sim import Fleet
from router.bench.turn_loss import TurnLoss
from router.bench.workloads import Request


class ChargedFleet(Fleet):
    """A :class:`Fleet` whose workers are :class:`ChargedEngine` s."""

    def __init__(
        self,
        policy: str,
        *,
        model: ChargedModel,
        speeds: Sequence[float] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(policy, **kwargs)
        speeds = list(speeds or [])
        self.sims = [
            ChargedEngine(kv, model, speeds[i % len(speeds)] if speeds else 1.0)
            for i, kv in enumerate(self.engines)
        ]
        self._notes: list[tuple[float, int, str, Any]] = []
        self._pending: dict[str, tuple[int, int, int]] = {}  # rid -> (worker, n, estimate)
        self.tpot: list[float] = []
        self.warm_requests = 0  # prefix-warming requests sent (``Decision.warm``)
        # The routing core's idle share and hit-loss rate as each request saw them.
        self._idle_sum = 0.0
        self._loss_sum = 0.0
        # Hits lost to eviction as the engines saw them, the same way for every policy:
        # a previous turn evicted before the next was routed, a hit evicted in the queue.
        self.turn_loss = TurnLoss(self.engines)
        self._expected_hits = 0
        self._queue_lost = 0

    def _push(self, t: float, kind: str, payload: Any) -> None:
        self._seq += 1
        heapq.heappush(self._notes, (t, self._seq, kind, payload))

    def _run(self, until: float) -> None:
        for w, sim in enumerate(self.sims):
            notes = EngineNotes()
            sim.run_until(until, notes)
            for t, events in notes.events:
                self._push(t + self.event_delay_s, "events", (w, events))
            for rid, hit, saved in notes.admitted:
                self._admitted(rid, hit, saved)
            for rid in notes.rejected:
                self._rejected(rid, sim.clock)
            for t, rid, ttft in notes.first_tokens:
                self.stats.ttft.append(ttft)
                self._push(t, "first", rid)
            for t, rid, tpot in notes.finished:
                self.tpot.append(tpot)
                self._push(t, "finish", rid)

    def _admitted(self, rid: str, truth: int, saved: int) -> None:
        _, _, est = self._pending.pop(rid)
        self.core.observe_cached(est, truth)
        s = self.stats
        s.hit_tokens += saved
        self._expected_hits += est
        self._queue_lost += max(0, est - truth)
        s.exact += est == truth
        s.abs_err += abs(est - truth)
        s.over += est > truth
        s.under += est < truth

    def _rejected(self, rid: str, t: float) -> None:
        self._pending.pop(rid)
        self.stats.rejected += 1
        self._push(t, "finish", rid)

    async def advance(self, now: float) -> None:
        self._run(now)
        while self._notes and self._notes[0][0] <= now:
            t, _, kind, payload = heapq.heappop(self._notes)
            if kind == "events":
                await self._apply(payload[0], payload[1], t)
            elif kind == "first":
                self.core.first_token(payload, now=t)
                self.turn_loss.prefilled(payload)
            else:
                self.core.finish(payload, now=t)

    async def step(
        self, req: Request, prepared: EngineRequest, packed: Sequence[int] | None = None
    ) -> None:
        now = req.arrival
        await self.advance(now)
        tokens = req.token_ids if packed is None else packed
        self.turn_loss.check(req.session_id, prepared)
        scores = await self.scorer.score_result(tokens, self.worker_ids)  # type: ignore[arg-type]
        engines = {wid: sim.stats() for wid, sim in zip(self.worker_ids, self.sims, strict=True)}
        decision = self.core.route(
            req.request_id,
            req.token_ids,
            scores.workers,
            policy=self.policy,
            now=now,
            decode_tokens=req.output_tokens,
            engines=engines,
        )
        w = self.worker_ids.index(decision.worker_id)
        n = len(req.token_ids)
        s = self.stats
        s.requests += 1
        s.prompt_tokens += n
        s.tokens_by_worker[w] += n
        s.predicted_used += decision.predicted_tokens > decision.hit_tokens
        self._pending[req.request_id] = (w, n, decision.hit_tokens)
        self.turn_loss.served(req.session_id, req.request_id, w, prepared)
        self.sims[w].submit(req.request_id, now, prepared, req.output_tokens, decision.warm)
        self.warm_requests += len(decision.warm)
        self._idle_sum += self.core.idle
        self._loss_sum += self.core.pressure.loss_rate

    def summary(self) -> dict[str, Any]:
        out = super().summary()
        tpot = sorted(self.tpot)
        out["tpot_mean_s"] = round(sum(tpot) / len(tpot), 5) if tpot else 0.0
        out["unfinished"] = len(self._pending)
        out["engine_steps"] = sum(sim.steps for sim in self.sims)
        if self.warm_requests:
            out["warm_requests"] = self.warm_requests
        # Prompt tokens per worker count cached tokens as load; engine-seconds do not.
        busy = [sim.busy_s for sim in self.sims]
        mean = sum(busy) / len(busy)
        out["busy_imbalance"] = round(max(busy) / mean, 4) if mean else 1.0
        # The routing core's own samples: continuations (kv_aware's prefix memory only)
        # and admission reports, so not comparable across policies; the engines' figures
        # that follow (previous turns evicted, queue loss) are.
        pressure = self.core.pressure
        out["hits_lost_to_eviction"] = round(pressure.losses / max(pressure.samples, 1), 4)
        out.update(self.turn_loss.summary())
        out["queue_hit_tokens_lost"] = round(self._queue_lost / max(self._expected_hits, 1), 4)
        seen = max(self.stats.requests, 1)
        out["idle_share_mean"] = round(self._idle_sum / seen, 4)
        out["loss_rate_mean"] = round(self._loss_sum / seen, 4)
        return out
