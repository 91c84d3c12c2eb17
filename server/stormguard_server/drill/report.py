"""The drill's outputs that are text: the table on stdout and the JSON file."""

from __future__ import annotations

import json
import os
import platform
from collections.abc import Sequence
from pathlib import Path
from typing import Any

# (column title, JSON key, format) of the stdout table. "attempts" are the server's
# count, or the client's where the server counts none (vLLM: see attempts_source);
# "amp srv" then shows NOT_AVAILABLE.
_COLUMNS = (
    ("client", "client", "{}"),
    ("adm", "admission", "{}"),
    ("logical", "logical_requests", "{}"),
    ("attempts", "attempts", "{}"),
    ("amp srv", "retry_amplification_server", "{:.2f}"),
    ("amp cli", "retry_amplification_client", "{:.2f}"),
    ("amp incident", "incident_retry_amplification_server", "{:.2f}"),
    ("success", "success_rate", "{:.1%}"),
    ("goodput", "goodput_tps", "{:.0f}"),
    ("/cap", "goodput_ratio", "{:.0%}"),
    ("burst/cap", "burst_goodput_ratio", "{:.0%}"),
    ("p50 s", "latency_p50_s", "{:.2f}"),
    ("p99 s", "latency_p99_s", "{:.2f}"),
    ("ttft50", "ttft_p50_s", "{:.2f}"),
    ("ttft99", "ttft_p99_s", "{:.2f}"),
    ("oom", "oom_count", "{}"),
    ("restarts", "restart_count", "{}"),
    ("loops", "oom_restart_loop_count", "{}"),
    ("recovery s", "recovery_s", "{:.1f}"),
    ("gone tok", "gone_client_tokens", "{}"),
)


NOT_AVAILABLE = "\u2013"  # an en dash, as docs/benchmarks.md writes "not available"


def _cell(value: Any, fmt: str) -> str:
    """NOT_AVAILABLE for a figure not measured or not available on the engine, never 0."""
    return NOT_AVAILABLE if value is None else fmt.format(value)


def table(pairings: Sequence[dict[str, Any]]) -> str:
    """A fixed-width table, one row per pairing."""
    rows = [[title for title, _, _ in _COLUMNS]]
    rows += [[_cell(p[key], fmt) for _, key, fmt in _COLUMNS] for p in pairings]
    widths = [max(len(row[i]) for row in rows) for i in range(len(_COLUMNS))]
    lines = ["  ".join(cell.rjust(w) for cell, w in zip(row, widths, strict=True)) for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def markdown_table(pairings: Sequence[dict[str, Any]]) -> str:
    """The same table in Markdown (for docs/benchmarks.md)."""
    head = "| " + " | ".join(title for title, _, _ in _COLUMNS) + " |"
    rule = "|" + "---|" * len(_COLUMNS)
    body = [
        "| " + " | ".join(_cell(p[key], fmt) for _, key, fmt in _COLUMNS) + " |" for p in pairings
    ]
    return "\n".join([head, rule, *body])


def load_average() -> list[float] | None:
    """1, 5 and 15 min load averages: other work on the machine skews the figures."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def machine() -> dict[str, Any]:
    """What the figures ran on, and how busy it was when the drill started."""
    cpu = "unknown"
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text(errors="replace").splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return {
        "nproc": os.cpu_count(),
        "cpu_model": cpu,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "load_average_at_start": load_average(),
    }


def write_json(path: Path, document: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=1) + "\n")
