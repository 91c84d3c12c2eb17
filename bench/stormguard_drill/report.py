"""The drill's outputs that are text: the table on stdout and the JSON file.

Each scenario has its columns (the avalanche's burst window and recovery; the
backlog's drain, crashes and missed targets), and every table starts with a line that
names the scenario, as the JSON's ``scenario`` does.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
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
# The burst's and the rebound's: "drain s" is when the last call ended, "/cap" the
# goodput over the drain against the calibrated capacity, "p99/ideal" the p99 over the
# drain at capacity, "2nd crash" the crashes beyond the drill's own, "back s" when the
# engine was ready again, "cpu s" the drill process's CPU time (the client's cost),
# "missed" the targets a pairing missed.
_BACKLOG_COLUMNS = (
    ("client", "client", "{}"),
    ("adm", "admission", "{}"),
    ("logical", "logical_requests", "{}"),
    ("attempts", "attempts", "{}"),
    ("amp srv", "retry_amplification_server", "{:.2f}"),
    ("amp cli", "retry_amplification_client", "{:.2f}"),
    ("success", "success_rate", "{:.1%}"),
    ("goodput", "goodput_tps", "{:.0f}"),
    ("/cap", "goodput_ratio", "{:.0%}"),
    ("p50 s", "latency_p50_s", "{:.2f}"),
    ("p99 s", "latency_p99_s", "{:.2f}"),
    ("drain s", "drain_s", "{:.2f}"),
    ("p99/drain", "p99_over_drain", "{:.2f}"),
    ("p99/ideal", "p99_over_ideal_drain", "{:.2f}"),
    ("ttft99", "ttft_p99_s", "{:.2f}"),
    ("oom", "oom_count", "{}"),
    ("crashes", "crash_count", "{}"),
    ("2nd crash", "extra_crashes", "{}"),
    ("back s", "back_s", "{:.2f}"),
    ("cpu s", "client_cpu_s", "{:.1f}"),
    ("failed as", "errors", "errors"),
    ("missed", "missed", "list"),
)
# The fleet's: attempts per call counted at the replicas ("srv", the live ones) and in
# the client processes' records ("cli", refused connections included), then per replica
# at the replicas (r0/r1/...); "dead/loop/slow share" the share of calls that sent an
# attempt to that sick replica after the fault's first second; "rejoin s" how long the
# restarted replica took to get half its fair share again; "crashes" the looping
# replica's engine crashes. Dotted keys reach into the pairing's nested figures.
_FLEET_COLUMNS = (
    ("client", "client", "{}"),
    ("adm", "admission", "{}"),
    ("logical", "logical_requests", "{}"),
    ("success", "success_rate", "{:.1%}"),
    ("att/call srv", "retry_amplification_server", "{:.2f}"),
    ("att/call cli", "retry_amplification_client", "{:.2f}"),
    ("per replica srv", "replicas", "replicas"),
    ("dead share", "sick_share.dead.share", "{:.1%}"),
    ("loop share", "sick_share.crash_loop.share", "{:.1%}"),
    ("slow share", "sick_share.slow.share", "{:.1%}"),
    ("p50 s", "latency_p50_s", "{:.2f}"),
    ("p99 s", "latency_p99_s", "{:.2f}"),
    ("recovery s", "recovery_s", "{:.1f}"),
    ("rejoin s", "rejoin_s", "{:.1f}"),
    ("crashes", "crash_loop.crashes_counted", "{}"),
    ("cpu s", "client_cpu_s", "{:.1f}"),
    ("failed as", "errors", "errors"),
    ("missed", "missed", "list"),
)
# The quota's: each row one client under one variant (processes, the limit that binds,
# the Retry-After the 429s carry, the x-ratelimit headers on or off); requests per call
# at the server ("srv", every status) and as the client counts them ("cli"), the
# server's 429s, the batch's wall time against the ideal the quota allows.
_QUOTA_COLUMNS = (
    ("variant", "variant", "{}"),
    ("client", "client", "{}"),
    ("calls", "calls", "{}"),
    ("success", "success_rate", "{:.1%}"),
    ("req/call srv", "requests_per_call_server", "{:.2f}"),
    ("req/call cli", "requests_per_call_client", "{:.2f}"),
    ("429s", "server_429s", "{}"),
    ("wall s", "wall_s", "{:.1f}"),
    ("ideal s", "ideal_wall_s", "{:.1f}"),
    ("wall/ideal", "wall_over_ideal", "{:.2f}"),
    ("p50 s", "latency_p50_s", "{:.2f}"),
    ("p99 s", "latency_p99_s", "{:.2f}"),
    ("cpu s", "client_cpu_s", "{:.1f}"),
    ("failed as", "errors", "errors"),
    ("missed", "missed", "list"),
)
# The provider outage's: figures of the calls that started during the outage (the
# primary in partial outage), the share served by the secondary then and after the
# recovery began, attempts per call at the primary and the secondary during the outage
# (the servers' counts), how long after the recovery calls were back on the primary,
# and the primary's peak attempts per second after the outage.
_OUTAGE_COLUMNS = (
    ("client", "client", "{}"),
    ("logical", "logical_requests", "{}"),
    ("success", "success_rate", "{:.1%}"),
    ("outage ok", "outage_success_rate", "{:.1%}"),
    ("p50 s", "outage_latency_p50_s", "{:.2f}"),
    ("p99 s", "outage_latency_p99_s", "{:.2f}"),
    ("ttft50", "outage_ttft_p50_s", "{:.2f}"),
    ("ttft99", "outage_ttft_p99_s", "{:.2f}"),
    ("on 2nd", "outage_secondary_share", "{:.1%}"),
    ("att/call", "outage_attempts_per_call", "{:.2f}"),
    ("att 1st", "outage_primary_attempts_per_call", "{:.2f}"),
    ("att 2nd", "outage_secondary_attempts_per_call", "{:.2f}"),
    ("2nd after", "after_secondary_share", "{:.1%}"),
    ("back s", "back_on_primary_s", "{:.1f}"),
    ("peak 1st", "primary_peak_over_offered_after", "{:.2f}"),
    ("failed as", "windows.outage.errors", "errors"),
)
# The replicas': both parts' rows; prefill tokens computed and the prefix cache's hit
# rate say what affinity saves, TTFT p99 and requests per call what hedging costs.
_REPLICAS_COLUMNS = (
    ("part", "part", "{}"),
    ("client", "client", "{}"),
    ("calls", "calls", "{}"),
    ("success", "success_rate", "{:.1%}"),
    ("ttft50", "ttft_p50_s", "{:.3f}"),
    ("ttft99", "ttft_p99_s", "{:.3f}"),
    ("prefill", "prefill_tokens", "{}"),
    ("hit", "cache_hit_rate", "{:.1%}"),
    ("max/fair", "max_over_fair", "{:.2f}"),
    ("req/call", "requests_per_call", "{:.2f}"),
    ("hedges", "hedges_sent", "{}"),
    ("loser tok", "loser_tokens", "{}"),
    ("failed as", "errors", "errors"),
)
_COLUMNS_OF = {
    "avalanche": _COLUMNS,
    "burst": _BACKLOG_COLUMNS,
    "rebound": _BACKLOG_COLUMNS,
    "fleet": _FLEET_COLUMNS,
    "quota": _QUOTA_COLUMNS,
    "outage": _OUTAGE_COLUMNS,
    "replicas": _REPLICAS_COLUMNS,
}
# Columns of a scenario that say nothing about it: the burst has no crash.
_HIDDEN = {"burst": {"crash_count", "extra_crashes", "back_s"}}
SCENARIO_TITLES = {
    "avalanche": "the OOM avalanche (a burst of long prompts overflows the KV cache)",
    "burst": "a burst against a server that sheds (all calls at t = 0)",
    "rebound": "a cold start, then the backlog's rebound (engine crashed at ~1 s)",
    "fleet": "a partial outage of a fleet (one replica dead, one crash-looping, one slow;"
    " then recovery)",
    "quota": "a batch job on one API key meets a hosted API's quota (TPM/RPM, 429s)",
    "outage": "a provider in partial outage (5xx, hangs, x10 time to first token), then"
    " recovering; a healthy, slower secondary",
    "replicas": "three replicas with prefix caching: conversations over shared system"
    " prompts (affinity), then one replica slow for a while (hedging)",
}


NOT_AVAILABLE = "\u2013"  # an en dash, as docs/benchmarks.md writes "not available"


def _cell(value: Any, fmt: str) -> str:
    """NOT_AVAILABLE for a figure not measured or not available on the engine, never 0."""
    if value is None:
        return NOT_AVAILABLE
    if fmt == "list":
        return ",".join(value) if value else "none"
    if fmt == "errors":  # {"APIStatusError": 12, "deadline": 3} -> "12 APIStatusError, 3 deadline"
        return ", ".join(f"{n} {name}" for name, n in value.items()) if value else "-"
    if fmt == "replicas":  # the fleet's replicas -> "0.12/0.45/0.20/0.31" attempts per call
        return "/".join(_cell(r.get("server_attempts_per_call"), "{:.2f}") for r in value)
    return fmt.format(value)


def _value(pairing: dict[str, Any], key: str) -> Any:
    """``pairing[key]``; a dotted key reaches into nested figures (None where absent)."""
    value: Any = pairing
    for part in key.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def _columns(scenario: str) -> tuple[tuple[str, str, str], ...]:
    hidden = _HIDDEN.get(scenario, set())
    return tuple(c for c in _COLUMNS_OF.get(scenario, _COLUMNS) if c[1] not in hidden)


def title(scenario: str) -> str:
    """The line that names the scenario above every table."""
    return f"scenario {scenario}: {SCENARIO_TITLES.get(scenario, scenario)}"


def table(pairings: Sequence[dict[str, Any]], scenario: str = "avalanche") -> str:
    """A fixed-width table, one row per pairing, under the scenario's title."""
    columns = _columns(scenario)
    rows = [[name for name, _, _ in columns]]
    rows += [[_cell(_value(p, key), fmt) for _, key, fmt in columns] for p in pairings]
    widths = [max(len(row[i]) for row in rows) for i in range(len(columns))]
    lines = ["  ".join(cell.rjust(w) for cell, w in zip(row, widths, strict=True)) for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join([title(scenario), *lines])


def markdown_table(pairings: Sequence[dict[str, Any]], scenario: str = "avalanche") -> str:
    """The same table in Markdown (for docs/benchmarks.md), the scenario named above it."""
    columns = _columns(scenario)
    head = "| " + " | ".join(name for name, _, _ in columns) + " |"
    rule = "|" + "---|" * len(columns)
    body = [
        "| " + " | ".join(_cell(_value(p, key), fmt) for _, key, fmt in columns) + " |"
        for p in pairings
    ]
    return "\n".join([f"**{title(scenario)}**", "", head, rule, *body])


def load_average() -> list[float] | None:
    """1, 5 and 15 min load averages: other work on the machine skews the figures."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def source() -> dict[str, Any]:
    """Which code ran: stormguard's version and, in a git checkout, the commit and the
    files changed in the work tree (the drill imports the SDK from wherever it is
    installed: an editable install runs the work tree as it was when the drill started)."""
    import stormguard

    state: dict[str, Any] = {"stormguard_version": stormguard.__version__}
    root = str(Path(stormguard.__file__).resolve().parents[2])
    try:
        commit = _git(root, "rev-parse", "--short", "HEAD").strip()
        changed = _git(root, "status", "--porcelain", "--", "sdk", "server").splitlines()
    except (OSError, subprocess.SubprocessError):  # not a checkout, or no git
        return state
    return {**state, "git_commit": commit, "changed_files": [line[3:] for line in changed]}


def _git(root: str, *args: str) -> str:
    # Our own fixed git command lines, no shell.
    done = subprocess.run(  # noqa: S603
        ["git", "-C", root, *args],  # noqa: S607
        capture_output=True,
        text=True,
        timeout=5,
        check=True,
    )
    return done.stdout


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
