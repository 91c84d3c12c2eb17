"""Runs one outage pairing: a fresh primary and secondary, the schedule replayed open
loop, the primary's faults driven through its admin endpoint, both servers' counts
scraped."""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from typing import Any

import httpx

from stormguard_drill.outage.clients import (
    PRIMARY_MODEL,
    SECONDARY_MODEL,
    OutageCall,
    OutageClientName,
    make_outage_client,
)
from stormguard_drill.outage.config import (
    OutageConfig,
)
from stormguard_drill.outage.records import CallRecord, OutageRun
from stormguard_drill.sampler import MetricsSampler
from stormguard_drill.servers import ServerFleet, ServerProcess
from stormguard_drill.workload import Arrival

_SCRAPE_HZ = 2.0


async def run_outage_pairing(
    fleet: ServerFleet, config: OutageConfig, name: OutageClientName, schedule: list[Arrival]
) -> OutageRun:
    """One client against a fresh primary and secondary, through every phase."""
    primary, secondary = await asyncio.gather(
        fleet.start(
            f"{name}-primary",
            "--model-alias",
            PRIMARY_MODEL,
            "--added-latency-ms",
            str(config.primary_latency_s * 1000.0),
            admin=True,
        ),
        fleet.start(
            f"{name}-secondary",
            "--model-alias",
            SECONDARY_MODEL,
            "--added-latency-ms",
            str(config.secondary_latency_s * 1000.0),
        ),
    )
    try:
        client = make_outage_client(
            name, primary.base_url, secondary.base_url, config.deadline_s, config.first_chunk_s
        )
        try:
            return await _replay(config, name, client, schedule, primary, secondary)
        finally:
            await client.aclose()
    finally:
        fleet.stop(primary)
        fleet.stop(secondary)


async def _replay(
    config: OutageConfig,
    name: OutageClientName,
    client: Any,
    schedule: list[Arrival],
    primary: ServerProcess,
    secondary: ServerProcess,
) -> OutageRun:
    t0 = time.monotonic()
    samplers = [MetricsSampler(s.root, t0, _SCRAPE_HZ) for s in (primary, secondary)]
    tasks = [asyncio.create_task(s.run()) for s in samplers]
    fault_errors: list[str] = []
    faults = asyncio.create_task(_drive_faults(config, primary, t0, fault_errors))
    records: list[CallRecord] = []

    async def one(arrival: Arrival) -> None:
        await asyncio.sleep(max(0.0, t0 + arrival.at_s - time.monotonic()))
        started = time.monotonic()
        outcome: OutageCall
        try:
            outcome = await asyncio.wait_for(client.call(arrival), config.deadline_s)
        except asyncio.TimeoutError:
            outcome = OutageCall(ok=False, error="deadline")
        ended = time.monotonic()
        ttft = None if outcome.first_token_at is None else outcome.first_token_at - started
        records.append(
            CallRecord(
                start_s=started - t0,
                latency_s=ended - started,
                ttft_s=ttft,
                ok=outcome.ok,
                provider=outcome.provider if outcome.ok else None,
                error=outcome.error,
            )
        )

    try:
        await asyncio.gather(*(one(a) for a in schedule))
    finally:
        faults.cancel()
        for task in tasks:
            task.cancel()
        for task in (faults, *tasks):
            with contextlib.suppress(asyncio.CancelledError):
                await task
    for sampler in samplers:
        await sampler.final()
    records.sort(key=lambda r: r.start_s)
    return OutageRun(
        name, records, samplers[0].samples, samplers[1].samples, client.stats(), fault_errors
    )


async def _drive_faults(
    config: OutageConfig, primary: ServerProcess, t0: float, errors: list[str]
) -> None:
    """Set the primary's faults at the outage's start and once a second of the recovery."""
    bounds = config.window_bounds()
    start = bounds["outage"][0]
    ramp = [bounds["recovery"][0] + i for i in range(math.ceil(config.recovery_s) + 1)]
    moments = [start, *ramp]
    async with httpx.AsyncClient(timeout=5.0) as http:
        for at in moments:
            await asyncio.sleep(max(0.0, t0 + at - time.monotonic()))
            body = config.faults_at(time.monotonic() - t0)
            try:
                response = await http.post(
                    primary.admin_url("/admin/faults"), json=body, headers=primary.admin_headers
                )
                response.raise_for_status()
            except httpx.HTTPError as exc:
                errors.append(f"{at:.1f}s: {type(exc).__name__}: {exc}")
