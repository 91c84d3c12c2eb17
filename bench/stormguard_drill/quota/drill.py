"""``stormguard-drill --scenario quota``: every client x every variant, the JSON document.

The pairings run one after another by default (``--concurrency``: more at once, each
on its own server), every one on the same seeded batch. One warm-up server (no quota)
serves every worker's warm-up call, and prices the batch once (``demand_tokens``)
for the ideal wall time.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from stormguard_drill.config import BacklogWorkload, Wave
from stormguard_drill.quota.client_names import QUOTA_CLIENT_TITLES, QuotaClientName
from stormguard_drill.quota.config import QuotaRunConfig, QuotaVariant
from stormguard_drill.quota.records import QuotaRun
from stormguard_drill.quota.runner import demand_tokens, run_quota_pairings
from stormguard_drill.quota.summary import summarize_quota
from stormguard_drill.report import load_average, machine, source
from stormguard_drill.servers import EngineSpec, ServerFleet
from stormguard_drill.workload import Arrival, build_schedule


def quota_schedule(config: QuotaRunConfig) -> list[Arrival]:
    """The batch: every call there at t = 0, prompts of the scenario's shape, seeded."""
    workload = config.workload
    wave = Wave(workload.calls, 0.0, 0.0, workload.shape, "medium")
    return build_schedule(BacklogWorkload(waves=(wave,), grace_s=0.0), config.seed)


async def quota_drill(
    config: QuotaRunConfig,
    out: Path,
    clients: list[QuotaClientName],
    skipped: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The whole quota drill; returns the JSON document."""
    schedule = quota_schedule(config)
    started = time.monotonic()
    host = machine()
    code = source()
    pairings: list[tuple[QuotaVariant, QuotaClientName]] = [
        (variant, client) for variant in config.variants for client in clients
    ]
    failed: dict[str, str] = {}
    partial = out / "pairings.jsonl"  # each pairing's figures as it ends
    partial.parent.mkdir(parents=True, exist_ok=True)
    partial.write_text("")
    async with ServerFleet(out / "logs", EngineSpec(args=config.engine_args)) as servers:
        warmup = await servers.start("warm-up")
        try:
            demand = await demand_tokens(warmup, schedule)

            def keep(run: QuotaRun) -> None:
                with partial.open("a") as lines:
                    lines.write(json.dumps(summarize_quota(run, config, demand)) + "\n")

            runs = await run_quota_pairings(
                servers, config, pairings, schedule, warmup, out / "logs", failed, keep
            )
        finally:
            servers.stop(warmup)
    return {
        "scenario": config.scenario,
        "mode": config.mode,
        "seed": config.seed,
        "engine": "sim",
        "engine_args": list(config.engine_args),
        "concurrency": config.concurrency,
        "stream": config.stream,
        "workload": asdict(config.workload),
        "variants": [{**asdict(v), "name": v.name} for v in config.variants],
        "clients": {c: QUOTA_CLIENT_TITLES[c] for c in clients},
        "targets": asdict(config.targets),
        "demand_tokens": demand,
        "skipped": skipped or {},
        "failed": failed,
        "logical_requests_per_pairing": len(schedule),
        "machine": {**host, "load_average_at_end": load_average()},
        "source": code,
        "wall_time_s": round(time.monotonic() - started, 1),
        "pairings": [summarize_quota(run, config, demand) for run in runs],
    }
