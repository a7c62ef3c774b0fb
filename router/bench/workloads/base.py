"""The request type every workload yields, and deterministic token synthesis.

Traces such as Mooncake's carry content *ids* rather than text. To drive real engines
(which hash token ids) we expand each id to a block of token ids derived from
``(seed, id, position)`` with a vectorised splitmix64 mix: the same id always yields the
same tokens, different ids yield unrelated tokens, so prefix sharing in the trace becomes
prefix sharing in token space -- at any engine block size.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

DEFAULT_VOCAB = 32_000
# Token ids below this are left to "special" tokens, as in real vocabularies.
_FIRST_TOKEN = 100

_C_SEED = np.uint64(0x9E3779B97F4A7C15)
_C_ID = np.uint64(0xBF58476D1CE4E5B9)
_C_POS = np.uint64(0x94D049BB133111EB)


@dataclass(frozen=True, slots=True)
class Request:
    """One inference request of a workload.

    ``arrival`` is in seconds from the workload's start; ``session_id`` groups the turns
    of a conversation or agent loop (inferred from the content for traces).
    """

    request_id: str
    arrival: float
    token_ids: Sequence[int]
    output_tokens: int
    session_id: str = ""
    kind: str = "trace"

    @property
    def prompt_tokens(self) -> int:
        return len(self.token_ids)


def _mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser (vectorised; uint64 arithmetic wraps by design)."""
    x = x ^ (x >> np.uint64(30))
    x = x * np.uint64(0xBF58476D1CE4E5B9)
    x = x ^ (x >> np.uint64(27))
    x = x * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def segment_tokens(
    segment_ids: Sequence[int],
    lengths: Sequence[int],
    seed: int = 0,
    vocab: int = DEFAULT_VOCAB,
) -> list[int]:
    """Concatenate ``lengths[i]`` tokens of content ``segment_ids[i]``, for every i.

    Token ``j`` of a segment depends only on ``(seed, segment id, j)``, so a segment that
    is cut short (a partial last block) is a prefix of the same segment at full length.
    """
    if len(segment_ids) != len(lengths):
        raise ValueError("segment_ids and lengths must have the same length")
    total = int(sum(lengths))
    if total == 0:
        return []
    lens = np.asarray(lengths, dtype=np.int64)
    if (lens < 0).any():
        raise ValueError("segment lengths must be non-negative")
    ids = np.repeat(np.asarray(segment_ids, dtype=np.uint64), lens)
    starts = np.repeat(np.cumsum(lens) - lens, lens)
    pos = (np.arange(total, dtype=np.int64) - starts).astype(np.uint64)
    with np.errstate(over="ignore"):
        x = np.uint64(seed & 0xFFFFFFFFFFFFFFFF) * _C_SEED + ids * _C_ID + pos * _C_POS
        x = _mix64(x)
    span = np.uint64(vocab - _FIRST_TOKEN)
    return ((x % span) + np.uint64(_FIRST_TOKEN)).astype(np.int64).tolist()
