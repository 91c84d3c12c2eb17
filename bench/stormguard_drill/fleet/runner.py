"""Runs the fleet's pairings: fresh replicas, client processes, the faults' timeline.

One pairing, for one client:

1. the client processes are spawned (``fleet/worker.py``, through
   ``worker_pipe.WorkerProcess``) and given their jobs: the replicas' addresses (ports
   chosen up front) and each its share of the seeded schedule (arrival ``i`` to process
   ``i % processes``); meanwhile the replicas start,
   each a fresh reference server with its admin endpoint on free loopback ports;
2. each process imports, warms up on the drill's warm-up server and says it is ready;
3. the pairing starts at one ``time.monotonic()`` instant sent to every process: the
   replicas are sampled and the faults done on the same clock (``fleet/faults.py``);
4. each process sends its results, the timeline ends, the replicas are stopped.

A process that fails or says nothing in time fails the pairing, with its log's tail;
every process and server is stopped on the way out, Ctrl-C included.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

from stormguard_drill.clients.drill_client import ClientName
from stormguard_drill.fleet.config import FleetConfig
from stormguard_drill.fleet.faults import Replicas, run_timeline
from stormguard_drill.fleet.records import FaultLog, FleetRun
from stormguard_drill.fleet.worker import Job, WorkerResult
from stormguard_drill.records import Admission
from stormguard_drill.servers import ServerFleet, ServerProcess
from stormguard_drill.worker_pipe import READY_TIMEOUT_S, RESULT_SLACK_S, WorkerProcess
from stormguard_drill.workload import Arrival

# The pairing starts this long after the last process is ready: time to send t0.
START_DELAY_S = 0.3


def server_args(config: FleetConfig, admission: Admission) -> tuple[str, ...]:
    return ("--admission", admission, "--seed", str(config.seed), "--engine", "sim")


async def run_fleet_pairing(
    servers: ServerFleet,
    config: FleetConfig,
    client: ClientName,
    admission: Admission,
    schedule: list[Arrival],
    warmup: ServerProcess,
    log_dir: Path,
) -> FleetRun:
    """One pairing on a fresh fleet (see the module doc)."""
    label = f"fleet-{client}-admission-{admission}"
    workers = [
        await WorkerProcess.spawn(
            log_dir / f"{label}-client{k}.log", "stormguard_drill.fleet.worker"
        )
        for k in range(config.processes)
    ]
    replicas = Replicas(servers, label, server_args(config, admission), config.replicas)
    timeline: asyncio.Task[None] | None = None
    try:
        end_after = config.workload.duration_s + config.workload.grace_s
        jobs = [
            Job(
                client=client,
                process=k,
                seed=config.seed * 1000 + k,
                base_urls=replicas.base_urls,
                warmup_url=warmup.base_url,
                patience=config.patience,
                arrivals=[a for a in schedule if a.index % config.processes == k],
                end_after_s=end_after,
            )
            for k in range(config.processes)
        ]
        # The processes import and warm up while the replicas start.
        await asyncio.gather(
            replicas.start(), *(w.send(j.to_json()) for w, j in zip(workers, jobs, strict=True))
        )
        for worker in workers:
            await worker.receive(READY_TIMEOUT_S, "it was ready")
        t0 = time.monotonic() + START_DELAY_S
        replicas.sample(t0, config.sample_hz)
        log = FaultLog()
        timeline = asyncio.create_task(run_timeline(replicas, config.timeline, t0, log))
        for worker in workers:
            await worker.send(json.dumps({"t0": t0}))
        wait = end_after + START_DELAY_S + RESULT_SLACK_S
        outputs = [
            WorkerResult.from_json(await worker.receive(wait, "its results")) for worker in workers
        ]
        await timeline
        await replicas.stop()
        return FleetRun(
            client=client,
            admission=admission,
            addresses=replicas.addresses,
            results=sorted((r for o in outputs for r in o.results), key=lambda r: r.index),
            attempts={i: a for o in outputs for i, a in o.attempts.items()},
            replica_samples=[replicas.samples(i) for i in range(config.replicas)],
            faults=log,
            processes=[
                {
                    "process": o.process,
                    "calls": len(o.results),
                    "client_attempts": o.client_attempts,
                    "client_stats": o.client_stats,
                    "cpu_s": o.cpu_s,
                }
                for o in outputs
            ],
            ejections=[(o.process, e) for o in outputs for e in o.ejections],
        )
    finally:
        if timeline is not None:
            timeline.cancel()
            await asyncio.gather(timeline, return_exceptions=True)
        for worker in workers:
            worker.kill()
        await asyncio.gather(*(w.process.wait() for w in workers), return_exceptions=True)
        await replicas.stop()
