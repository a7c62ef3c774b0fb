"""Rate-limited logging with counts: the replacement for "log once per process".

Why: a fault that repeats (undecodable frames, a failing write, a bad client) must stay
visible for as long as it lasts, yet must not flood the log. ``RateLimitedLog`` logs the
first ``burst`` occurrences of each key, then at most one line per ``interval_s``; every
line after a quiet spell says how many were suppressed since the previous line, and
``counts`` keeps the totals (export them as metrics where an operator needs them)::

    limited = RateLimitedLog(log)  # burst=5, interval_s=60
    limited.warning(("decode", worker), "worker %s: undecodable frame (%s)", worker, why,
                    extra=event_extra("decode_error", worker=worker))

The suppressed count is appended to the message (`` [N similar suppressed in 42s]``) and,
for JSON logs, added as the ``suppressed`` field.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

__all__ = ["RateLimitedLog"]


@dataclass(slots=True)
class _KeyState:
    total: int = 0
    suppressed: int = 0
    last_logged: float = 0.0


class RateLimitedLog:
    """Per-key log limiter over one ``logging.Logger``.

    ``burst``: occurrences logged unconditionally per key; ``interval_s``: afterwards at
    most one line per key per interval; ``max_keys``: keys remembered (the oldest is
    forgotten beyond it, so keys derived from input cannot grow memory without bound).
    ``clock`` is injectable for tests.
    """

    def __init__(
        self,
        logger: logging.Logger,
        *,
        burst: int = 5,
        interval_s: float = 60.0,
        max_keys: int = 4096,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if burst < 0 or interval_s < 0 or max_keys < 1:
            raise ValueError("burst >= 0, interval_s >= 0 and max_keys >= 1 are required")
        self.logger = logger
        self.burst = burst
        self.interval_s = interval_s
        self.max_keys = max_keys
        self._clock = clock
        self._keys: dict[Hashable, _KeyState] = {}

    def count(self, key: Hashable) -> int:
        """How many times ``key`` occurred (logged or not)."""
        state = self._keys.get(key)
        return 0 if state is None else state.total

    @property
    def counts(self) -> dict[Hashable, int]:
        return {k: s.total for k, s in self._keys.items()}

    def log(self, level: int, key: Hashable, msg: str, *args: Any, **kwargs: Any) -> bool:
        """Count an occurrence of ``key``; log it if within the limits. True if logged."""
        kwargs.setdefault("stacklevel", 3)
        return self._log(level, key, msg, args, kwargs)

    def _log(
        self, level: int, key: Hashable, msg: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> bool:
        state = self._keys.get(key)
        if state is None:
            if len(self._keys) >= self.max_keys:
                self._keys.pop(next(iter(self._keys)))
            state = self._keys[key] = _KeyState()
        state.total += 1
        now = self._clock()
        if state.total > self.burst and now - state.last_logged < self.interval_s:
            state.suppressed += 1
            return False
        if not self.logger.isEnabledFor(level):
            state.last_logged = now
            state.suppressed = 0
            return False
        if state.suppressed:
            msg = f"{msg} [%d similar suppressed in %.0fs]"
            args = (*args, state.suppressed, now - state.last_logged)
            extra = dict(kwargs.get("extra") or {})
            extra["suppressed"] = state.suppressed
            kwargs["extra"] = extra
        state.last_logged = now
        state.suppressed = 0
        self.logger.log(level, msg, *args, **kwargs)
        return True

    def debug(self, key: Hashable, msg: str, *args: Any, **kwargs: Any) -> bool:
        kwargs.setdefault("stacklevel", 3)
        return self._log(logging.DEBUG, key, msg, args, kwargs)

    def info(self, key: Hashable, msg: str, *args: Any, **kwargs: Any) -> bool:
        kwargs.setdefault("stacklevel", 3)
        return self._log(logging.INFO, key, msg, args, kwargs)

    def warning(self, key: Hashable, msg: str, *args: Any, **kwargs: Any) -> bool:
        kwargs.setdefault("stacklevel", 3)
        return self._log(logging.WARNING, key, msg, args, kwargs)

    def error(self, key: Hashable, msg: str, *args: Any, **kwargs: Any) -> bool:
        kwargs.setdefault("stacklevel", 3)
        return self._log(logging.ERROR, key, msg, args, kwargs)

    def exception(self, key: Hashable, msg: str, *args: Any, **kwargs: Any) -> bool:
        kwargs.setdefault("exc_info", True)
        kwargs.setdefault("stacklevel", 3)
        return self._log(logging.ERROR, key, msg, args, kwargs)
