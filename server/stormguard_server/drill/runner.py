"""Runs the calibration and the pairings: fresh server, schedule replayed, results kept.

A pairing fires every arrival of the schedule at its time (open loop: arrivals do
not wait for earlier calls, as users do not), samples the server's metrics while it
runs, then waits at most ``grace_s`` after the last arrival before giving up on
calls still running (they count as failures). Client and server are always closed.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from stormguard_server.drill.app import LogicalResult, run_logical, unfinished
from stormguard_server.drill.clients import ClientName, StormguardClient, make_client
from stormguard_server.drill.config import DrillConfig
from stormguard_server.drill.sampler import MetricsSampler, Parse, parse_sim
from stormguard_server.drill.servers import ServerFleet
from stormguard_server.drill.vllm import parse_vllm
from stormguard_server.drill.workload import Arrival, build_schedule

Admission = Literal["off", "on"]
ADMISSIONS: tuple[Admission, ...] = ("off", "on")
Tick = Callable[[int], None]  # progress: n logical requests finished


@dataclass
class PairingRun:
    """Everything measured in one client x server pairing."""

    client: ClientName
    admission: Admission
    engine: str
    results: list[LogicalResult]
    client_attempts: int
    samples: list[tuple[float, dict[str, float]]]
    final_metrics: dict[str, float]
    max_in_flight: int
    client_stats: dict[str, float] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return f"{self.client} / admission {self.admission}"


@dataclass(frozen=True, slots=True)
class Calibration:
    """The engine's capacity: completion tokens/s under a full batch of admissible work."""

    capacity_tps: float
    calls: int
    window_s: float
    concurrency: int


def _server_args(config: DrillConfig, admission: Admission) -> tuple[str, ...]:
    return ("--admission", admission, "--seed", str(config.seed), "--engine", config.engine)


def _parser(config: DrillConfig) -> Parse:
    return parse_vllm if config.engine == "vllm" else parse_sim


async def calibrate(fleet: ServerFleet, config: DrillConfig) -> Calibration:
    """Closed loop of ``calibration_concurrency`` callers of short prompts behind admission
    (so nothing is shed or crashes); capacity = completion tokens finished per second after
    the first second of warm-up."""
    server = await fleet.start("calibration", *_server_args(config, "on"))
    client = StormguardClient(server.base_url, config.patience.timeout_s)
    rng = random.Random(config.seed + 1)
    workload = config.workload
    # Draw prompts from the same short shape the drill uses.
    pool = [a for a in build_schedule(workload, rng.randrange(1 << 30)) if a.kind == "short"]
    t0 = time.monotonic()
    warmup, end = t0 + min(1.0, config.calibration_s / 3), t0 + config.calibration_s
    tokens, calls = 0, 0

    async def caller(offset: int) -> None:
        nonlocal tokens, calls
        i = offset
        while time.monotonic() < end:
            outcome = await client.call(pool[i % len(pool)])
            i += config.calibration_concurrency
            now = time.monotonic()
            if outcome.ok and warmup <= now <= end:
                tokens += outcome.completion_tokens
                calls += 1

    try:
        await asyncio.gather(*(caller(k) for k in range(config.calibration_concurrency)))
    finally:
        await client.aclose()
        fleet.stop(server)
    window = end - warmup
    return Calibration(tokens / window, calls, window, config.calibration_concurrency)


async def run_pairing(
    fleet: ServerFleet,
    config: DrillConfig,
    client_name: ClientName,
    admission: Admission,
    schedule: list[Arrival],
    tick: Tick,
) -> PairingRun:
    """One pairing on its own fresh server."""
    server = await fleet.start(
        f"{client_name}-admission-{admission}".replace("+", "-"), *_server_args(config, admission)
    )
    client = make_client(client_name, server.base_url, config.patience.timeout_s)
    t0 = time.monotonic()
    sampler = MetricsSampler(
        server.root, t0, config.sample_hz, parse=_parser(config), client_attempts=client.attempts
    )
    sampler_task = asyncio.create_task(sampler.run())
    tasks: dict[asyncio.Task[LogicalResult], Arrival] = {}
    in_flight = max_in_flight = 0

    async def logical(arrival: Arrival) -> LogicalResult:
        nonlocal in_flight, max_in_flight
        in_flight += 1
        max_in_flight = max(max_in_flight, in_flight)
        try:
            return await run_logical(client, arrival, config.patience, t0)
        finally:
            in_flight -= 1
            tick(1)

    try:
        for arrival in schedule:
            delay = t0 + arrival.at_s - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks[asyncio.create_task(logical(arrival))] = arrival
        deadline = t0 + config.workload.duration_s + config.workload.grace_s
        _, pending = await asyncio.wait(tasks, timeout=max(0.0, deadline - time.monotonic()))
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        stopped = time.monotonic() - t0
        results = [
            unfinished(tasks[task], tasks[task].at_s, stopped) if task in pending else task.result()
            for task in tasks
        ]
        sampler_task.cancel()
        await asyncio.gather(sampler_task, return_exceptions=True)
        final = await sampler.final()
        stats: dict[str, float] = {}
        if isinstance(client, StormguardClient):
            snapshot = client.stats()
            stats = {
                "logical_calls": snapshot.logical_calls,
                "attempts": snapshot.attempts,
                "retries": snapshot.retries,
                "retries_refused_by_budget": snapshot.retries_refused_by_budget,
                "retry_amplification": snapshot.retry_amplification,
            }
        return PairingRun(
            client=client_name,
            admission=admission,
            engine=config.engine,
            results=sorted(results, key=lambda r: r.index),
            client_attempts=client.attempts(),
            samples=sampler.samples,
            final_metrics=final,
            max_in_flight=max_in_flight,
            client_stats=stats,
        )
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        sampler_task.cancel()
        await asyncio.gather(sampler_task, return_exceptions=True)
        await client.aclose()
        fleet.stop(server)


async def run_all(
    fleet: ServerFleet,
    config: DrillConfig,
    schedule: list[Arrival],
    pairings: list[tuple[ClientName, Admission]],
    tick: Tick,
) -> list[PairingRun]:
    """Every pairing, ``config.concurrency`` at a time (1: strictly one after another)."""
    gate = asyncio.Semaphore(config.concurrency)

    async def gated(client_name: ClientName, admission: Admission) -> PairingRun:
        async with gate:
            return await run_pairing(fleet, config, client_name, admission, schedule, tick)

    return list(await asyncio.gather(*(gated(c, a) for c, a in pairings)))
