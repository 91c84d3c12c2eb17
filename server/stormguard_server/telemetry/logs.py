"""Structured logs: one JSON object per line on stderr.

Fields: ``ts`` (UTC, ISO 8601), ``level``, ``logger``, ``msg``, plus any
``extra={...}`` the caller passed (``event`` names what happened, e.g.
``engine_crash``). ``--log-format text`` gives plain lines for humans.
"""

from __future__ import annotations

import datetime
import json
import logging
import sys
from typing import Any

# Attributes every LogRecord has; anything else came from ``extra``.
# (uvicorn's ``color_message`` is its message with terminal colours: not for JSON.)
_STANDARD = set(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {
    "message",
    "asctime",
    "color_message",
}


class JsonFormatter(logging.Formatter):
    """Render a record as one JSON line."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": datetime.datetime.fromtimestamp(record.created, datetime.timezone.utc)
            .isoformat(timespec="milliseconds")
            .replace("+00:00", "Z"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _STANDARD and not key.startswith("_"):
                entry[key] = value
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def configure_logging(level: str = "info", fmt: str = "json") -> None:
    """Route every logger (ours and uvicorn's) to one stderr handler."""
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logger = logging.getLogger(name)
        logger.handlers[:] = []
        logger.propagate = True
