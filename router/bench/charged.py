"""The charged engine model: what a continuous-batching engine charges, step by step.

``--engine-model charged`` replaces the simple model (one prefill at a time, free decode,
blocks released at admission) with a vLLM-V1-style engine per worker:

* steps of continuous batching under a token budget (``max_batched_tokens``) and a
  sequence cap (``max_seqs``): running decodes first (one token each), then chunked
  prefill of running prompts, then admission of waiting requests FCFS;
* a request is admitted only when its new blocks fit (running requests *hold* their KV
  blocks until they finish, so a hot worker's cache is under real pressure; its prefix
  hit is whatever is cached at admission, not at routing);
* step time = ``step_s`` + prefill tokens x ``prefill_token_s`` + chunk attention
  (token x context) x ``attn_s`` + decode sequences x ``seq_s`` + decode context tokens
  x ``kv_read_s``, divided by the worker's speed (heterogeneous fleets);
* optionally vLLM's ``--long-prefill-token-threshold`` (``long_prefill_token_threshold``,
  off by default as in vLLM): while more than one request is running or waiting, no
  request prefills more than that many tokens in a step;
* the router hears a request's first token (prefill over) and its finish, and learns each
  worker's speed from them (``router.routing.speed``); nothing is given to it;
* a request the router shapes (``Decision.warm``) arrives as prefix-warming requests of
  the given lengths (one output token each) and then in full, each sent the moment the
  one before it has its token (no round trip is charged): each is a request of its own
  to the engine, admitted FCFS behind whatever arrived meanwhile, its blocks released to
  the cache when it finishes (evictable until the next one hits them).

Constants (defaults of :class:`ChargedModel`): a roofline of Llama-3.1-8B in BF16 on one
H100 SXM, from public numbers only -- NVIDIA's H100 SXM datasheet (3.35 TB/s HBM3, 989
dense BF16 TFLOPS) and the model's published config (32 layers, hidden 4096, 8 KV heads
of 128 dims, 8.03 B parameters): weights 16.06 GB read once per step = 4.8 ms, plus 1 ms
of scheduler/sampling overhead; prefill 2 x 8.03e9 FLOP per token at an assumed 40% MFU =
40.6 us/token; causal attention 4 x 32 x 4096 FLOP per (token, context token) at 40% MFU
= 1.33 ns; KV cache 2 x 32 x 8 x 128 x 2 B = 128 KiB per token read per decode step =
39 ns/token; 20 us per running sequence. vLLM's defaults for the budget on an 80 GB GPU
(max_num_batched_tokens 8192 for the OpenAI server, max_num_seqs 256). With blocks of 512
tokens (64 MiB each) an H100 holds ~1000 blocks after the weights: the "tight" cache.
Decode output tokens get no KV blocks of their own (they are <3% of the Mooncake
trace's tokens) and there is no preemption: admission waits instead.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from offload_core.kv_cache import KVCacheManager, RequestPlan, RequestTooLargeError
from offload_core.kv_cache import Request as EngineRequest
from router.routing.policy import EngineStats
from schemas import KVEvent


@dataclass(frozen=True, slots=True)
class ChargedModel:
    """Step-time constants of one engine at speed 1.0 (see the module docstring)."""

    step_s: float = 0.0058
    prefill_token_s: float = 4.06e-5
    attn_s: float = 1.33e-9
    kv_read_s: float = 3.9e-8
    seq_s: float = 2.0e-5
    max_batched_tokens: int = 8192
    max_seqs: int = 256
    # vLLM's ``--long-prefill-token-threshold`` (0, its default, is off): no request
    # prefills more than this many tokens in a step while another request is running or
    # waiting, so a long prompt in chunked prefill leaves budget to the queue behind it.
    long_prefill_token_threshold: int = 0

    @property
    def prefill_tps(self) -> float:
        return 1.0 / self.prefill_token_s


@dataclass(slots=True)
class _Waiting:
    rid: str
    arrival: float
    prepared: EngineRequest
    out: int
    # Prompt lengths of the warming requests still to send before the request itself.
    warm: tuple[int, ...] = ()
    # Prompt tokens prefilled so far by its warming requests (hits are what was not).
    computed: int = 0
    # Cached tokens at its first admission (what the router's estimate is checked against).
    first_hit: int = -1
    # Prompt tokens of the warming request that ended last (what the next one should hit).
    warmed: int = 0

    def stage(self) -> EngineRequest:
        """The request to admit now: the next warming prefix, or the request itself."""
        if not self.warm:
            return self.prepared
        return prefix_request(self.prepared, self.warm[0])


@dataclass(slots=True)
class _Seq:
    rid: str
    arrival: float
    n: int
    done: int
    out_left: int
    out: int
    plan: RequestPlan
    first_token: float = 0.0
    # Set on a warming request: the request it warms for, re-queued when this one ends.
    then: _Waiting | None = None


def prefix_request(prepared: EngineRequest, tokens: int) -> EngineRequest:
    """The first ``tokens`` tokens of ``prepared`` as a request of their own (the block
    hashes of a prefix are the prefix of the block hashes: they chain)."""
    return EngineRequest(
        prepared.token_ids[:tokens],
        {size: digests[: tokens // size] for size, digests in prepared.hashes.items()},
        prepared.cache_salt,
        prepared.lora_name,
    )


@dataclass(slots=True)
class EngineNotes:
    """What one engine did since the last call, time-stamped."""

    events: list[tuple[float, list[KVEvent]]] = field(default_factory=list)
    # (rid, cached tokens at its first admission, prompt tokens never prefilled)
    admitted: list[tuple[str, int, int]] = field(default_factory=list)
    rejected: list[str] = field(default_factory=list)
    first_tokens: list[tuple[float, str, float]] = field(default_factory=list)  # t, rid, ttft
    finished: list[tuple[float, str, float]] = field(default_factory=list)  # t, rid, tpot


class ChargedEngine:
    """One worker: a waiting queue, a running batch, a clock (when the next step starts)."""

    def __init__(self, kv: KVCacheManager, model: ChargedModel, speed: float = 1.0) -> None:
        self.kv = kv
        self.m = model
        self.speed = speed
        self.waiting: deque[_Waiting] = deque()
        self.running: list[_Seq] = []
        # Requests whose warming request ended with the last step: they queue at the start
        # of the next one, behind whatever was submitted while that step ran.
        self.resent: list[_Waiting] = []
        self.clock = 0.0
        self.steps = 0
        # Seconds spent in steps: the engine's work, whatever it was (prefill at any
        # context, decode); the fleet's busy-time imbalance is read from it.
        self.busy_s = 0.0

    def submit(
        self,
        rid: str,
        arrival: float,
        prepared: EngineRequest,
        out: int,
        warm: Sequence[int] = (),
    ) -> None:
        if not self.running and not self.waiting and not self.resent:
            self.clock = max(self.clock, arrival)
        self.waiting.append(_Waiting(rid, arrival, prepared, max(1, out), tuple(warm)))

    def stats(self) -> EngineStats:
        pool = self.kv.pool
        return EngineStats(
            queue_depth=len(self.waiting),
            kv_usage=1.0 - pool.num_free_blocks / pool.num_blocks,
            cached_blocks=pool.num_cached_blocks,
        )

    def _chunk_cap(self) -> int:
        """Most prefill tokens one request gets this step (vLLM counts running + waiting
        at the start of the step; a request alone is never capped)."""
        cap = self.m.long_prefill_token_threshold
        if cap > 0 and len(self.running) + len(self.waiting) > 1:
            return cap
        return self.m.max_batched_tokens

    def _admit(self, notes: EngineNotes, budget: int, cap: int) -> list[tuple[_Seq, int]]:
        chunks: list[tuple[_Seq, int]] = []
        while self.waiting and budget > 0 and len(self.running) < self.m.max_seqs:
            w = self.waiting[0]
            prepared = w.stage()
            try:
                plan = self.kv.begin(prepared)
            except RequestTooLargeError:
                if self.running:
                    break  # wait for blocks to be released
                self.waiting.popleft()
                notes.rejected.append(w.rid)
                continue
            self.waiting.popleft()
            self.kv.allocate(plan)
            self.kv.commit(plan)
            notes.events.append((self.clock, self.kv.pool.take_events()))
            n = len(prepared.token_ids)
            hit = plan.hit.hit_tokens
            if w.first_hit < 0:
                w.first_hit = hit
            if w.warmed and hit < w.warmed:
                # What the last warming request cached was evicted before this one came:
                # the router sees it in this one's cached tokens and sends the request
                # itself next (re-warming under eviction would compute the prompt again
                # and again).
                w.warm = w.warm[:1]
            if w.warm:
                w.computed += n - hit
                w.warmed = n
                seq = _Seq(w.rid, w.arrival, n, hit, 0, 1, plan, then=w)
            else:
                # Hits: prompt tokens no request of this one prefilled.
                notes.admitted.append((w.rid, w.first_hit, hit - w.computed))
                seq = _Seq(w.rid, w.arrival, n, hit, w.out - 1, w.out, plan)
            self.running.append(seq)
            chunk = min(n - hit, budget, cap)
            budget -= chunk
            chunks.append((seq, chunk))
        return chunks

    def run_until(self, until: float, notes: EngineNotes) -> None:
        """Run every step that starts at or before ``until``."""
        m = self.m
        while (self.running or self.waiting or self.resent) and self.clock <= until:
            if self.resent:
                self.waiting.extend(self.resent)
                self.resent.clear()
            decode = [s for s in self.running if s.done >= s.n]
            budget = m.max_batched_tokens - len(decode)
            cap = self._chunk_cap()
            chunks: list[tuple[_Seq, int]] = []
            for s in self.running:
                if s.done < s.n and budget > 0:
                    c = min(s.n - s.done, budget, cap)
                    budget -= c
                    chunks.append((s, c))
            chunks += self._admit(notes, budget, cap)
            ctx = sum(s.n + (s.out - 1 - s.out_left) for s in decode)
            base = m.step_s + len(decode) * m.seq_s + ctx * m.kv_read_s
            if not chunks:
                if not decode:
                    return  # only blocked waiters and nothing running cannot happen
                self._fast_forward(decode, base, until, notes)
                continue
            prefill = sum(c for _, c in chunks)
            attn = sum(c * (s.done + c / 2) for s, c in chunks)
            dt = (base + prefill * m.prefill_token_s + attn * m.attn_s) / self.speed
            self.clock += dt
            self.busy_s += dt
            self.steps += 1
            end = self.clock
            for s, c in chunks:
                s.done += c
                if s.done >= s.n:
                    s.first_token = end
                    if s.then is None:
                        notes.first_tokens.append((end, s.rid, end - s.arrival))
            self._decode(decode, 1, end, notes)
            self._retire(notes, end)

    def _fast_forward(
        self, decode: list[_Seq], base: float, until: float, notes: EngineNotes
    ) -> None:
        """Decode-only steps until the first finish or the first step after ``until``."""
        k = len(decode)
        a = base / self.speed
        b = self.m.kv_read_s * k / self.speed  # each step reads k more context tokens
        most = min(s.out_left for s in decode)

        def start(j: int) -> float:
            return self.clock + j * a + b * j * (j - 1) / 2

        lo, hi = 1, most  # steps 0..lo-1 start <= until (step 0 does: clock <= until)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if start(mid - 1) <= until:
                lo = mid
            else:
                hi = mid - 1
        steps = lo
        self.busy_s += start(steps) - self.clock
        self.clock = start(steps)
        self.steps += steps
        self._decode(decode, steps, self.clock, notes)
        self._retire(notes, self.clock)

    @staticmethod
    def _decode(decode: Sequence[_Seq], steps: int, end: float, notes: EngineNotes) -> None:
        for s in decode:
            s.out_left -= steps

    def _retire(self, notes: EngineNotes, end: float) -> None:
        keep: list[_Seq] = []
        for s in self.running:
            if s.done >= s.n and s.out_left <= 0 and s.first_token <= end:
                self.kv.finish(s.plan)
                if s.then is not None:  # a warming request: send the next one
                    s.then.warm = s.then.warm[1:]
                    self.resent.append(s.then)
                    continue
                tpot = (end - s.first_token) / max(s.out - 1, 1)
                notes.finished.append((end, s.rid, tpot))
            else:
                keep.append(s)
        self.running = keep
