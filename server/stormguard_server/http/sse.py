"""Server-sent events in the shape the openai package parses.

One ``data: <json>`` line and a blank line per event; the stream ends with
``data: [DONE]``. An error after the stream has started is sent as an event
``{"error": {...}}``, as vLLM does, since the status line is already out.
"""

from __future__ import annotations

import json
from typing import Any

DONE = b"data: [DONE]\n\n"
MEDIA_TYPE = "text/event-stream"
HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}


def event(data: Any) -> bytes:
    """One SSE event carrying ``data`` as compact JSON."""
    return b"data: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"


def named_event(name: str, data: Any) -> bytes:
    """One SSE event with an ``event:`` line (the Responses API names each event)."""
    return b"event: " + name.encode() + b"\n" + event(data)
