"""``stormguard-drill --scenario fleet``: every pairing on a fresh fleet, the JSON document.

The pairings run one after another (each is seven processes on the machine: four
replicas and three client processes), all on the same seeded schedule and timeline.
One warm-up server serves every client process's warm-up call.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from stormguard_drill.clients.drill_client import ClientName
from stormguard_drill.fleet.config import FleetConfig
from stormguard_drill.fleet.runner import run_fleet_pairing, server_args
from stormguard_drill.fleet.summary import fleet_document_config, summarize_fleet
from stormguard_drill.fleet.targets import compare_with_router
from stormguard_drill.records import Admission
from stormguard_drill.report import load_average, machine, source
from stormguard_drill.servers import EngineSpec, ServerFleet
from stormguard_drill.workload import build_schedule


async def fleet_drill(
    config: FleetConfig,
    out: Path,
    pairings: list[tuple[ClientName, Admission]],
    skipped: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The whole fleet drill; returns the JSON document."""
    schedule = build_schedule(config.workload, config.seed)
    started = time.monotonic()
    host = machine()
    code = source()
    runs = []
    async with ServerFleet(out / "logs", EngineSpec(args=config.engine_args)) as servers:
        warmup = await servers.start("warm-up", *server_args(config, "on"))
        try:
            for client, admission in pairings:
                print(f"fleet: {client} / admission {admission} ...", file=sys.stderr)
                runs.append(
                    await run_fleet_pairing(
                        servers, config, client, admission, schedule, warmup, out / "logs"
                    )
                )
        finally:
            servers.stop(warmup)
    summaries = [summarize_fleet(run, config) for run in runs]
    compare_with_router(summaries)
    return {
        "scenario": config.scenario,
        "mode": config.mode,
        "seed": config.seed,
        "engine": "sim",
        **fleet_document_config(config),
        "skipped": skipped or {},
        "logical_requests_per_pairing": len(schedule),
        "machine": {**host, "load_average_at_end": load_average()},
        "source": code,
        "wall_time_s": round(time.monotonic() - started, 1),
        "pairings": summaries,
    }


def fleet_marks(config: FleetConfig) -> list[tuple[float, str]]:
    """(time, what) of each fault's start and of the recovery: the plots' dotted lines."""
    timeline = config.timeline
    marks = [(f.start_s, f"r{f.replica} {f.kind.replace('_', ' ')}") for f in timeline.faults]
    return [*marks, (timeline.recover_at_s, "recovery")]


def fleet_targets_line(config: FleetConfig) -> str:
    targets = config.targets
    return (
        f"success >= {targets.min_success:.1%}; attempts/call at the live replicas <= "
        f"{targets.max_attempts_per_call}; calls sent to the dead replica after its first "
        f"second <= {targets.max_dead_share:.0%}; p99 <= {targets.max_p99_over_router} x "
        "LiteLLM Router's (for stormguard; every row is checked)"
    )
