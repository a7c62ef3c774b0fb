"""``stop`` / ``stop_token_ids``: where a simulated answer ends, as vLLM 0.33 ends it.

Why: the tokens an answer keeps are the tokens the engine caches (a client's next turn
sends them back), and ``finish_reason`` / ``stop_reason`` are what clients branch on.
vLLM's rules (``v1/core/sched/utils.py`` ``check_stop``, ``v1/engine/detokenizer.py``
``check_stop_strings``):

* a generated token in ``stop_token_ids`` ends the answer: it is counted and cached, its
  text is left out (kept with ``include_stop_str_in_output``), ``stop_reason`` is its id;
* otherwise, once the answer's text contains a stop string (the one that completes
  earliest), the answer ends at the token that completed it and its text is cut before
  the string (after it with ``include_stop_str_in_output``); ``stop_reason`` is the string;
* either way ``finish_reason`` is ``"stop"``; an answer that runs out of tokens ends with
  ``"length"``.

The whole answer is known before it streams, so each token's delta is its share of the
final text; vLLM holds back a stop string's length of text while it streams instead, so
the chunk boundaries can differ, never the text they add up to.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

LENGTH: dict[str, Any] = {"finish_reason": "length", "stop_reason": None}


@dataclass(frozen=True, slots=True)
class StopRule:
    strings: tuple[str, ...] = ()
    token_ids: frozenset[int] = field(default_factory=frozenset)
    include: bool = False

    @classmethod
    def of(cls, body: Any) -> StopRule:
        """The request's rule (``stop`` is a string or a list of them)."""
        stop = getattr(body, "stop", None)
        strings = (stop,) if isinstance(stop, str) else tuple(stop or ())
        ids = frozenset(getattr(body, "stop_token_ids", None) or ())
        return cls(strings, ids, bool(getattr(body, "include_stop_str_in_output", False)))

    def refusal(self) -> str | None:
        """vLLM's ``SamplingParams`` message for a rule it refuses, or None."""
        if any(not s for s in self.strings):
            return "stop cannot contain an empty string."
        return None


@dataclass(frozen=True, slots=True)
class Ending:
    """Where one answer ends: the tokens it keeps (all counted and cached), each one's
    share of the final text, and its finish fields."""

    tokens: list[int]
    texts: list[str]
    finish: dict[str, Any]


def _first_stop(text: str, new_chars: int, strings: Sequence[str]) -> tuple[str, int] | None:
    """The stop string completing earliest in the newest ``new_chars`` of ``text`` (ties:
    list order), and where it starts."""
    best: tuple[str, int] | None = None
    best_end = len(text) + 1
    for s in strings:
        start = text.find(s, max(0, len(text) - new_chars - len(s) + 1))
        if start != -1 and start + len(s) < best_end:
            best, best_end = (s, start), start + len(s)
    return best


def end_answer(tokens: Sequence[int], texts: Sequence[str], rule: StopRule) -> Ending:
    """Apply ``rule`` to an answer of ``tokens`` whose texts are ``texts``."""
    if not rule.strings and not rule.token_ids:
        return Ending(list(tokens), list(texts), LENGTH)
    text = ""
    offsets = [0]
    for i, t in enumerate(tokens):
        if t in rule.token_ids:
            last = texts[i] if rule.include else ""
            return Ending(list(tokens[: i + 1]), [*texts[:i], last], _stopped(t))
        text += texts[i]
        offsets.append(len(text))
        hit = _first_stop(text, len(texts[i]), rule.strings) if rule.strings else None
        if hit is not None:
            s, start = hit
            kept = text[: start + len(s) if rule.include else start]
            shares = [kept[offsets[j] : offsets[j + 1]] for j in range(i + 1)]
            return Ending(list(tokens[: i + 1]), shares, _stopped(s))
    return Ending(list(tokens), list(texts), LENGTH)


def _stopped(reason: str | int) -> dict[str, Any]:
    return {"finish_reason": "stop", "stop_reason": reason}
