"""Two publishers under one topic: told apart from a publisher that restarted.

Why: with ``--listen``, engines name themselves in the topic (``kv@<pod-ip>@<model>``),
so two engines that share a pod IP -- two vLLM servers in one pod -- land on one worker.
Their seqs interleave, every other frame goes "back", and each one read as a publisher
restart cleared the worker and rebuilt it from the other engine's buffer: a resync storm
over an index that mixed two caches. A real restart takes an engine seconds to come back;
``RESTARTS`` seq rewinds within ``WINDOW_S`` do not happen that way, so they mark a
conflict: the worker's entries are cleared once and its frames dropped (state
``conflict``) until the rewinds stop for ``WINDOW_S``, when it is rebuilt.
"""

from __future__ import annotations

from collections import deque

# Seq rewinds within WINDOW_S that mark two publishers (a crash-looping engine restarts
# far less often: vLLM takes longer than this to start).
RESTARTS = 3
WINDOW_S = 10.0


class PublisherConflict:
    """Seq rewinds of one worker's stream and whether they mark a conflict now."""

    def __init__(self, restarts: int = RESTARTS, window_s: float = WINDOW_S) -> None:
        self.restarts, self.window_s = restarts, window_s
        self._rewinds: deque[float] = deque(maxlen=restarts)
        self.episodes = 0  # conflicts seen since registration
        # In a conflict the caller has not yet been told is over (``ended``).
        self.open = False

    def rewound(self, now: float) -> bool:
        """A seq went back at ``now``; True when this one starts a conflict."""
        self._rewinds.append(now)
        if self.open or len(self._rewinds) < self.restarts:
            return False
        if now - self._rewinds[0] > self.window_s:
            return False
        self.open = True
        self.episodes += 1
        return True

    def active(self, now: float) -> bool:
        """In a conflict: its last rewind less than ``window_s`` ago."""
        return self.open and now - self._rewinds[-1] <= self.window_s

    def ended(self, now: float) -> bool:
        """True once, at the first check after a conflict has gone quiet."""
        if self.open and not self.active(now):
            self.open = False
            self._rewinds.clear()
            return True
        return False
