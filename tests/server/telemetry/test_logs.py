"""Structured logs are one JSON object per line, extras included."""

from __future__ import annotations

import json
import logging

from stormguard_server.telemetry.logs import JsonFormatter


def test_json_formatter_keeps_extras_and_drops_terminal_colours() -> None:
    record = logging.LogRecord("stormguard_server.engine", logging.WARNING, "f", 1, "engine %s",
                               ("crashed",), None)  # fmt: skip
    record.event = "engine_crash"
    record.color_message = "\x1b[31mengine crashed\x1b[0m"
    line = JsonFormatter().format(record)
    entry = json.loads(line)
    assert entry["msg"] == "engine crashed"
    assert entry["level"] == "warning" and entry["event"] == "engine_crash"
    assert entry["ts"].endswith("Z")
    assert "color_message" not in entry
