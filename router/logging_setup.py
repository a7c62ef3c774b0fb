"""Router logging: human-readable lines by default, one JSON object per line on request.

Logs are for lifecycle events an operator acts on - a worker registered, connected,
disconnected, a gap, a replay, a resync, an index outage, a dropped dashboard client -
never for individual blocks or batches (those are counters in ``/metrics``). A log call
may name its event and fields through ``extra``; ``event_extra`` builds that dict::

    log.info("worker %s connected", wid, extra=event_extra("worker_connected", worker=wid))

In JSON mode every such field becomes a top-level key, so a log pipeline can filter on
``event`` and ``worker`` without parsing the message.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import sys
from typing import IO, Any

# LogRecord attributes that are not user fields (``extra`` keys are everything else).
# (``color_message`` is uvicorn's ANSI-coloured copy of the message.)
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message",
    "asctime",
    "color_message",
    "taskName",
}
_HANDLER_NAME = "kvroute"
# Loggers configured alongside ours so the whole process speaks one format.
_ALSO = ("uvicorn", "uvicorn.error", "uvicorn.access")


def event_extra(event: str, **fields: Any) -> dict[str, Any]:
    """``extra=`` for a lifecycle log line: ``event`` plus structured fields."""
    return {"event": event, **fields}


class JsonFormatter(logging.Formatter):
    """``{"ts", "level", "logger", "msg", <extra fields>, "exc"?}`` on one line."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": dt.datetime.fromtimestamp(record.created, tz=dt.UTC).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_") and key not in out:
                out[key] = value
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            out["exc"] = record.exc_text
        return json.dumps(out, default=str, separators=(",", ":"))


class TextFormatter(logging.Formatter):
    """``time level logger: message [key=value ...]`` - the fields stay visible in text."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)-7s %(name)s: %(message)s", "%H:%M:%S")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        fields = [
            f"{k}={v}"
            for k, v in vars(record).items()
            if k not in _STANDARD and not k.startswith("_")
        ]
        return f"{line} [{' '.join(fields)}]" if fields else line


def configure_logging(
    json: bool = False, level: str | int = "info", stream: IO[str] | None = None
) -> logging.Handler:
    """Install one handler on the root logger (replacing a previous call's) and route
    uvicorn's loggers through it; returns the handler. Pass ``log_config=None`` to
    uvicorn so it keeps this set-up."""
    lvl = logging.getLevelName(level.upper()) if isinstance(level, str) else level
    if not isinstance(lvl, int):
        raise ValueError(f"unknown log level {level!r}")
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.set_name(_HANDLER_NAME)
    handler.setFormatter(JsonFormatter() if json else TextFormatter())
    root = logging.getLogger()
    for old in [h for h in root.handlers if h.get_name() == _HANDLER_NAME]:
        root.removeHandler(old)
        old.close()
    root.addHandler(handler)
    root.setLevel(lvl)
    for name in _ALSO:
        logger = logging.getLogger(name)
        logger.handlers = []
        logger.propagate = True
    return handler
