"""``stormguard-drill --scenario outage``: every client's pairing, the JSON document.

The scenario, its phases and figures: the package's doc (``stormguard_drill.outage``)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from stormguard_drill.clients.litellm_client import import_litellm
from stormguard_drill.config import ENGINE_ARGS
from stormguard_drill.outage.clients import (
    OUTAGE_CLIENT_TITLES,
    OutageClientName,
)
from stormguard_drill.outage.config import (
    OutageConfig,
    outage_schedule,
)
from stormguard_drill.outage.records import OutageRun
from stormguard_drill.outage.runner import run_outage_pairing
from stormguard_drill.outage.summary import check_targets, summarize_outage
from stormguard_drill.report import load_average, machine, source
from stormguard_drill.servers import EngineSpec, ServerFleet


async def outage_drill(
    config: OutageConfig,
    out: Path,
    clients: list[OutageClientName],
    skipped: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The whole outage drill; returns the JSON document."""
    schedule = outage_schedule(config)
    if "litellm-router" in clients:
        import_litellm()  # now: a first import inside a pairing would stall the others
    started = time.monotonic()
    host = machine()
    code = source()
    runs: list[OutageRun] = []
    async with ServerFleet(out / "logs", EngineSpec(args=_engine_args(config))) as fleet:
        gate = asyncio.Semaphore(max(1, config.concurrency))

        async def pairing(name: OutageClientName) -> OutageRun:
            async with gate:
                return await run_outage_pairing(fleet, config, name, schedule)

        runs = list(await asyncio.gather(*(pairing(name) for name in clients)))
    pairings = [summarize_outage(run, config) for run in runs]
    return {
        "scenario": config.scenario,
        "mode": config.mode,
        "seed": config.seed,
        "engine": "sim",
        "config": {k: v for k, v in asdict(config).items() if k not in {"targets", "shape"}},
        "windows": {w: list(b) for w, b in config.window_bounds().items()},
        "clients": {c: OUTAGE_CLIENT_TITLES[c] for c in clients},
        "targets": asdict(config.targets),
        "targets_checked": check_targets(pairings, config),
        "skipped": skipped or {},
        "logical_requests_per_pairing": len(schedule),
        "machine": {**host, "load_average_at_end": load_average()},
        "source": code,
        "wall_time_s": round(time.monotonic() - started, 1),
        "pairings": pairings,
    }


def _engine_args(config: OutageConfig) -> tuple[str, ...]:
    """The drill's sim engine, seeded; without admission's sheds in the way of the faults."""
    return (*ENGINE_ARGS, "--seed", str(config.seed), "--admission", "off")
