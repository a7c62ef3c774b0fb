"""A seeded synthetic workload with the sharing patterns that make routing matter.

Three kinds of sessions, mixed and interleaved in time:

* ``chat``: multi-turn conversations; every prompt is the whole history (one of a few
  shared system prompts, then alternating user turns and assistant replies);
* ``agent``: tool-using loops whose context grows by a call and a tool result per step,
  with short pauses between steps;
* ``fanout``: one shared document followed by several sibling questions that arrive
  together -- the burst case the router's predicted entries exist for.

Every prompt opens with one platform-wide preamble and one of a few system prompts.
Content is built from segments (system prompt, user turn, reply, ...) with unique ids,
expanded to tokens by :func:`router.bench.workloads.base.segment_tokens`.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass

from router.bench.workloads.base import DEFAULT_VOCAB, Request, segment_tokens

Span = tuple[int, int]


@dataclass(frozen=True, slots=True)
class SyntheticConfig:
    """Sizes are inclusive ``(low, high)`` token ranges; times are seconds."""

    requests: int = 400
    seed: int = 0
    vocab: int = DEFAULT_VOCAB
    mix: tuple[float, float, float] = (0.5, 0.3, 0.2)  # chat, agent, fanout sessions
    session_rate: float = 2.0  # new sessions per second (Poisson)
    # Every prompt starts with one platform-wide preamble (the hot prefix a router must
    # not pile onto one worker), then one of a few shared system prompts.
    preamble_tokens: Span = (256, 512)
    system_prompts: int = 3
    system_tokens: Span = (256, 1024)
    chat_turns: Span = (2, 8)
    user_tokens: Span = (32, 256)
    reply_tokens: Span = (32, 256)
    think_time: tuple[float, float] = (2.0, 8.0)
    agent_steps: Span = (3, 10)
    agent_task_tokens: Span = (128, 512)
    tool_tokens: Span = (64, 512)
    call_tokens: Span = (16, 96)
    agent_pause: tuple[float, float] = (0.2, 1.5)
    fanout: Span = (3, 6)
    doc_tokens: Span = (512, 2048)
    question_tokens: Span = (16, 128)
    answer_tokens: Span = (32, 256)


@dataclass(slots=True)
class _Pending:
    arrival: float
    session: str
    kind: str
    segments: list[tuple[int, int]]  # (segment id, length)
    output: int


class _Builder:
    def __init__(self, cfg: SyntheticConfig) -> None:
        self.cfg = cfg
        self.rng = random.Random(cfg.seed)
        self._next_segment = 1
        self.preamble = self.segment(cfg.preamble_tokens)
        self.system = [self.segment(cfg.system_tokens) for _ in range(cfg.system_prompts)]

    def head(self) -> list[tuple[int, int]]:
        """The shared start of a session: the preamble and a random system prompt."""
        return [self.preamble, self.rng.choice(self.system)]

    def segment(self, span: Span) -> tuple[int, int]:
        seg = (self._next_segment, self.rng.randint(*span))
        self._next_segment += 1
        return seg

    def chat(self, start: float, name: str) -> list[_Pending]:
        cfg, rng = self.cfg, self.rng
        context = self.head()
        out: list[_Pending] = []
        t = start
        for _ in range(rng.randint(*cfg.chat_turns)):
            context.append(self.segment(cfg.user_tokens))
            reply = self.segment(cfg.reply_tokens)
            out.append(_Pending(t, name, "chat", list(context), reply[1]))
            context.append(reply)
            t += rng.uniform(*cfg.think_time)
        return out

    def agent(self, start: float, name: str) -> list[_Pending]:
        cfg, rng = self.cfg, self.rng
        context = [*self.head(), self.segment(cfg.agent_task_tokens)]
        out: list[_Pending] = []
        t = start
        for _ in range(rng.randint(*cfg.agent_steps)):
            call = self.segment(cfg.call_tokens)
            out.append(_Pending(t, name, "agent", list(context), call[1]))
            context += [call, self.segment(cfg.tool_tokens)]
            t += rng.uniform(*cfg.agent_pause)
        return out

    def fanout(self, start: float, name: str) -> list[_Pending]:
        cfg, rng = self.cfg, self.rng
        shared = [*self.head(), self.segment(cfg.doc_tokens)]
        return [
            _Pending(
                start + i * 1e-3,
                name,
                "fanout",
                [*shared, self.segment(cfg.question_tokens)],
                rng.randint(*cfg.answer_tokens),
            )
            for i in range(rng.randint(*cfg.fanout))
        ]


def _enough(pending: list[_Pending], wanted: int, now: float) -> bool:
    if len(pending) < wanted:
        return False
    return wanted == 0 or sorted(p.arrival for p in pending)[wanted - 1] <= now


def synthetic_workload(cfg: SyntheticConfig | None = None) -> list[Request]:
    """``cfg.requests`` requests sorted by arrival; identical for identical configs."""
    cfg = cfg or SyntheticConfig()
    if cfg.requests < 0:
        raise ValueError("requests must be non-negative")
    builder = _Builder(cfg)
    rng = builder.rng
    makers = (builder.chat, builder.agent, builder.fanout)
    pending: list[_Pending] = []
    t = 0.0
    n = 0
    # Sessions keep starting until enough requests exist before the last start time, so
    # truncating by arrival keeps complete early sessions and the tails of late ones.
    while not _enough(pending, cfg.requests, t):
        kind = rng.choices(range(3), weights=cfg.mix)[0]
        pending += makers[kind](t, f"{('chat', 'agent', 'fan')[kind]}{n}")
        n += 1
        t += rng.expovariate(cfg.session_rate)
    pending.sort(key=lambda p: p.arrival)
    out: list[Request] = []
    for i, p in enumerate(pending[: cfg.requests]):
        ids = [s for s, _ in p.segments]
        lengths = [length for _, length in p.segments]
        out.append(
            Request(
                request_id=f"s{i}",
                arrival=p.arrival,
                token_ids=segment_tokens(ids, lengths, cfg.seed, cfg.vocab),
                output_tokens=p.output,
                session_id=p.session,
                kind=p.kind,
            )
        )
    return out


def iter_synthetic(cfg: SyntheticConfig | None = None) -> Iterator[Request]:
    yield from synthetic_workload(cfg)
