"""Runs the calibration and the pairings: fresh server, schedule replayed, results kept.

A pairing fires every arrival of the schedule at its time (open loop: arrivals do
not wait for earlier calls, as users do not), samples the server's metrics while it
runs, then waits at most ``grace_s`` after the last arrival before giving up on
calls still running (they count as failures). Client and server are always closed.

The avalanche, the burst and the rebound differ only in what they hand this one
replay: the schedule, the server's engine flags (its ``ServerFleet``'s), the patience,
and for the rebound a mid-run action, the engine crash (``POST /admin/crash`` at
``crash_at_s``, on a server started with its admin endpoint). An action is part of
the replay: the calls due at or after its time are released once it is done, so
however slow the machine, no call of the backlog reaches the engine before the crash
it is meant to wait through.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable

import httpx

from stormguard_drill.app import replay, run_logical, sleep_until
from stormguard_drill.clients.drill_client import ClientName
from stormguard_drill.clients.registry import make_client
from stormguard_drill.clients.stormguard_client import StormguardClient
from stormguard_drill.config import BacklogWorkload, DrillConfig
from stormguard_drill.records import Admission, Calibration, LogicalResult, PairingRun
from stormguard_drill.sampler import MetricsSampler, Parse, parse_sim
from stormguard_drill.servers import ServerFleet, ServerProcess
from stormguard_drill.vllm import parse_vllm
from stormguard_drill.workload import Arrival, calibration_pool

Tick = Callable[[int], None]  # progress: n logical requests finished
# A mid-run action on the pairing's server: (server, t0, events to record into).
Action = Callable[[ServerProcess, float, dict[str, float]], Awaitable[None]]


def _server_args(config: DrillConfig, admission: Admission) -> tuple[str, ...]:
    return ("--admission", admission, "--seed", str(config.seed), "--engine", config.engine)


def _parser(config: DrillConfig) -> Parse:
    return parse_vllm if config.engine == "vllm" else parse_sim


def _crash_at(config: DrillConfig) -> float | None:
    workload = config.workload
    return workload.crash_at_s if isinstance(workload, BacklogWorkload) else None


# The calibration window stretches to at most this many times its length.
_CALIBRATION_PATIENCE = 10


async def calibrate(fleet: ServerFleet, config: DrillConfig) -> Calibration:
    """Closed loop of ``calibration_concurrency`` callers of the scenario's prompts behind
    admission (so nothing is shed or crashes); capacity = completion tokens finished per
    second after the first second of warm-up. The client does no pacing of its own (the
    closed loop is the pacing): the figure is the server's.

    The window runs ``calibration_s`` and on until a batch's worth of calls has finished
    in it: on a busy machine the first calls of a short window may all end after it, and
    a capacity of zero would size every pairing's load from nothing."""
    server = await fleet.start("calibration", *_server_args(config, "on"))
    client = StormguardClient(server.base_url, config.patience.timeout_s, paced=False)
    rng = random.Random(config.seed + 1)
    # Draw prompts from the same shapes the drill uses, with another seed.
    pool = calibration_pool(config.workload, rng.randrange(1 << 30))
    t0 = time.monotonic()
    warmup, end = t0 + min(1.0, config.calibration_s / 3), t0 + config.calibration_s
    latest = t0 + _CALIBRATION_PATIENCE * config.calibration_s
    enough = config.calibration_concurrency
    tokens, calls, stopped = 0, 0, latest
    done = asyncio.Event()

    async def caller(offset: int) -> None:
        nonlocal tokens, calls, stopped
        i = offset
        while not done.is_set():
            outcome = await client.call(pool[i % len(pool)])
            i += config.calibration_concurrency
            now = time.monotonic()
            if done.is_set():
                return
            if outcome.ok and warmup <= now:
                tokens += outcome.completion_tokens
                calls += 1
            if (now >= end and calls >= enough) or now >= latest:
                stopped = now
                done.set()

    try:
        await asyncio.gather(*(caller(k) for k in range(config.calibration_concurrency)))
    finally:
        await client.aclose()
        fleet.stop(server)
    if calls == 0:
        raise RuntimeError(
            f"calibration: no call finished in {latest - t0:.0f} s (see {server.log_path})"
        )
    window = stopped - warmup
    return Calibration(tokens / window, calls, window, config.calibration_concurrency)


async def warm_up(fleet: ServerFleet, config: DrillConfig, clients: list[ClientName]) -> None:
    """One call of each client on a throwaway server before any pairing: what a client
    does once per process (LiteLLM's lazy imports: ~0.4 s of CPU on its first call, with
    the event loop blocked) must not land inside a pairing's clock, where it would delay
    the schedule and the rebound's crash."""
    server = await fleet.start("warm-up", *_server_args(config, "on"))
    arrival = calibration_pool(config.workload, config.seed + 2)[0]
    try:
        for name in dict.fromkeys(clients):
            client = make_client(name, server.base_url, config.patience.timeout_s)
            try:
                await client.call(arrival)
            finally:
                await client.aclose()
    finally:
        fleet.stop(server)


async def run_pairing(
    fleet: ServerFleet,
    config: DrillConfig,
    client_name: ClientName,
    admission: Admission,
    schedule: list[Arrival],
    tick: Tick,
) -> PairingRun:
    """One pairing on its own fresh server."""
    crash_at = _crash_at(config)
    name = f"{client_name}-admission-{admission}".replace("+", "-")
    server = await fleet.start(name, *_server_args(config, admission), admin=crash_at is not None)
    try:
        client = make_client(client_name, server.base_url, config.patience.timeout_s)
    except BaseException:
        fleet.stop(server)
        raise
    t0, cpu0 = time.monotonic(), time.process_time()
    sampler = MetricsSampler(
        server.root,
        t0,
        config.sample_hz,
        parse=_parser(config),
        client_attempts=client.attempts,
        client_gauges=client.gauges,
    )
    sampler_task = asyncio.create_task(sampler.run())
    events: dict[str, float] = {}
    actions: list[tuple[float, Action]] = []
    if crash_at is not None:
        actions.append((crash_at, _crash))
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

    async def act_until(at_s: float) -> None:
        """Do the actions due by ``at_s``, each at its time (a crash that cannot be made
        fails the pairing)."""
        while actions and actions[0][0] <= at_s:
            when, action = actions.pop(0)
            await sleep_until(t0 + when)
            await action(server, t0, events)

    try:
        deadline = t0 + config.workload.duration_s + config.workload.grace_s
        results = await replay(schedule, t0, logical, deadline, before=act_until)
        cpu = time.process_time() - cpu0
        sampler_task.cancel()
        await asyncio.gather(sampler_task, return_exceptions=True)
        final = await sampler.final()
        return PairingRun(
            client=client_name,
            admission=admission,
            engine=config.engine,
            results=results,
            client_attempts=client.attempts(),
            samples=sampler.samples,
            final_metrics=final,
            max_in_flight=max_in_flight,
            client_stats=client.stats(),
            events=events,
            client_cpu_s=round(cpu, 2),
        )
    finally:
        sampler_task.cancel()
        await asyncio.gather(sampler_task, return_exceptions=True)
        await client.aclose()
        fleet.stop(server)


async def _crash(server: ServerProcess, t0: float, events: dict[str, float]) -> None:
    """Crash the engine now, as an OOM would: every running and queued request fails,
    then the cold start. The engine takes the crash at its next step, before it schedules
    anything that arrives after this returns. When it was sent goes into ``events``."""
    async with httpx.AsyncClient(timeout=10.0) as http:
        events["crash_sent_s"] = round(time.monotonic() - t0, 3)
        response = await http.post(
            server.admin_url("/admin/crash"), json={}, headers=server.admin_headers
        )
        response.raise_for_status()


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
