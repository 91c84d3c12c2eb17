"""Runs the fleet's pairings: fresh replicas, client processes, the faults' timeline.

One pairing, for one client:

1. the client processes are spawned (``fleet_worker.py``) and given their jobs: the
   replicas' addresses (ports chosen up front) and each its share of the seeded
   schedule (arrival ``i`` to process ``i % processes``); meanwhile the replicas start,
   each a fresh reference server with its admin endpoint on free loopback ports;
2. each process imports, warms up on the drill's warm-up server and says it is ready;
3. the pairing starts at one ``time.monotonic()`` instant sent to every process: the
   replicas are sampled and the faults done on the same clock (``fleet_faults.py``);
4. each process sends its results, the timeline ends, the replicas are stopped.

A process that fails or says nothing in time fails the pairing, with its log's tail;
every process and server is stopped on the way out, Ctrl-C included.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from stormguard_drill.app import LogicalResult
from stormguard_drill.clients.registry import ClientName
from stormguard_drill.fleet.config import FleetConfig
from stormguard_drill.fleet.faults import FaultLog, Replicas, Samples, run_timeline
from stormguard_drill.fleet.worker import Ejection, Job, WorkerResult
from stormguard_drill.runner import Admission
from stormguard_drill.servers import ServerFleet, ServerProcess
from stormguard_drill.workload import Arrival

# A process has this long to import, warm up and say it is ready (LiteLLM's first
# import takes seconds of CPU on a busy machine), and this long past the pairing's end
# to send its results.
READY_TIMEOUT_S = 120.0
RESULT_SLACK_S = 60.0
# The pairing starts this long after the last process is ready: time to send t0.
START_DELAY_S = 0.3
_LINE_LIMIT = 1 << 26  # a process's results are one JSON line


@dataclass
class FleetRun:
    """Everything measured in one pairing of the fleet."""

    client: ClientName
    admission: Admission
    addresses: list[str]  # "host:port" of each replica, by replica index
    results: list[LogicalResult]  # every process's, by arrival index
    attempts: dict[int, list[tuple[float, str]]]  # by arrival index: (s from t0, host:port)
    replica_samples: list[Samples]
    faults: FaultLog
    processes: list[dict[str, object]] = field(default_factory=list)  # client stats and cpu
    ejections: list[tuple[int, Ejection]] = field(default_factory=list)  # (process, ...)


def server_args(config: FleetConfig, admission: Admission) -> tuple[str, ...]:
    return ("--admission", admission, "--seed", str(config.seed), "--engine", "sim")


class WorkerProcess:
    """One client process (a fleet or quota worker), spoken to line by line."""

    def __init__(self, process: asyncio.subprocess.Process, log_path: Path) -> None:
        self.process = process
        self.log_path = log_path

    @classmethod
    async def spawn(
        cls, log_path: Path, module: str = "stormguard_drill.fleet.worker"
    ) -> WorkerProcess:
        """``python -m module``, its stderr to ``log_path``."""
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with log_path.open("wb") as log:
            process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                module,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=log,
                limit=_LINE_LIMIT,
            )
        return cls(process, log_path)

    async def send(self, line: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(line.encode() + b"\n")
        await self.process.stdin.drain()

    async def receive(self, timeout: float, what: str) -> str:
        assert self.process.stdout is not None
        try:
            line = await asyncio.wait_for(self.process.stdout.readline(), timeout)
        except asyncio.TimeoutError:
            raise RuntimeError(f"client process {what}: nothing after {timeout:.0f} s") from None
        if not line:
            await self.process.wait()
            tail = self.log_path.read_text(errors="replace")[-3000:]
            raise RuntimeError(
                f"client process exited ({self.process.returncode}) before {what}:\n{tail}"
            )
        return line.decode()

    def kill(self) -> None:
        if self.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.kill()


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
        await WorkerProcess.spawn(log_dir / f"{label}-client{k}.log")
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
