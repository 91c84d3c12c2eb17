"""One client process of the fleet: its share of the calls, through its own client.

``python -m stormguard_drill.fleet.worker``, started by the fleet runner, which
talks to it over stdin and stdout, one JSON document a line:

1. the runner writes the job (``Job``): which client, the replicas, this process's
   arrivals, the patience and a warm-up server;
2. the worker makes one call through a throwaway client on the warm-up server (what a
   client does once per process, such as LiteLLM's lazy imports, stays out of the
   pairing's clock), builds its real client and writes ``{"ready": true}``;
3. the runner writes ``{"t0": ...}``, the pairing's start as a ``time.monotonic()``
   value: the clock is the system's monotonic one, shared by every process of the
   machine, so every process fires its arrivals on the same timeline as the faults;
4. the worker replays its arrivals (open loop: ``app.replay``, as the other scenarios'
   runner does), then writes its results (``WorkerResult``) and exits.

The protocol has the process's stdout to itself (``worker_pipe.py``): anything a
library prints goes to stderr, which the runner sends to a file of the run's ``logs/``.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from dataclasses import asdict, dataclass, field

import stormguard
from stormguard_drill.app import replay, run_logical
from stormguard_drill.clients import attempt_log
from stormguard_drill.clients.drill_client import ClientName
from stormguard_drill.config import Patience
from stormguard_drill.fleet.clients import make_fleet_client
from stormguard_drill.fleet.records import Ejection
from stormguard_drill.records import LogicalResult
from stormguard_drill.worker_pipe import claim_stdout, send
from stormguard_drill.workload import Arrival


@dataclass(frozen=True, slots=True)
class Job:
    """What one client process runs."""

    client: ClientName
    process: int
    seed: int
    base_urls: list[str]
    warmup_url: str
    patience: Patience
    arrivals: list[Arrival]
    end_after_s: float  # from t0: stop waiting for unfinished calls then

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Job:
        raw = json.loads(text)
        raw["patience"] = Patience(**raw["patience"])
        raw["arrivals"] = [Arrival(**a) for a in raw["arrivals"]]
        return cls(**raw)


@dataclass
class WorkerResult:
    """One process's calls: results, and each call's attempts as (seconds from t0,
    "host:port") by arrival index; the client's ejection transitions, if it has any."""

    process: int
    results: list[LogicalResult]
    attempts: dict[int, list[tuple[float, str]]]
    client_attempts: int | None
    client_stats: dict[str, float] = field(default_factory=dict)
    cpu_s: float = 0.0
    ejections: list[Ejection] = field(default_factory=list)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> WorkerResult:
        raw = json.loads(text)
        raw["results"] = [LogicalResult(**r) for r in raw["results"]]
        raw["attempts"] = {
            int(k): [(float(t), str(where)) for t, where in v] for k, v in raw["attempts"].items()
        }
        raw["ejections"] = [
            (float(t), str(e), str(was), str(to), str(why))
            for t, e, was, to, why in raw["ejections"]
        ]
        return cls(**raw)


async def _warm_up(job: Job) -> None:
    client = make_fleet_client(job.client, [job.warmup_url], job.patience.timeout_s, job.seed)
    try:
        await client.call(job.arrivals[0] if job.arrivals else _WARMUP)
    finally:
        await client.aclose()


_WARMUP = Arrival(index=-1, at_s=0.0, kind="short", prompt="warm up", max_tokens=4)


async def run(job: Job) -> WorkerResult:
    await _warm_up(job)
    # Listeners may run in the SDK's connect-check threads: list.append is atomic.
    transitions: list[stormguard.EjectionTransition] = []
    client = make_fleet_client(
        job.client, job.base_urls, job.patience.timeout_s, job.seed, transitions.append
    )
    try:
        send({"ready": True})
        line = await asyncio.to_thread(sys.stdin.readline)
        t0 = float(json.loads(line)["t0"])
        cpu0 = time.process_time()
        records: dict[int, list[attempt_log.Attempt]] = {}

        async def logical(arrival: Arrival) -> LogicalResult:
            records[arrival.index] = attempt_log.new_call()  # this task's own record
            return await run_logical(client, arrival, job.patience, t0)

        results = await replay(job.arrivals, t0, logical, t0 + job.end_after_s)
        return WorkerResult(
            process=job.process,
            results=results,
            attempts={
                index: [(round(at - t0, 4), where) for at, where in record]
                for index, record in records.items()
            },
            client_attempts=client.attempts(),
            client_stats=client.stats(),
            cpu_s=round(time.process_time() - cpu0, 2),
            ejections=[
                (round(e.at - t0, 4), e.endpoint, e.from_status.value, e.to_status.value, e.reason)
                for e in list(transitions)
            ],
        )
    finally:
        await client.aclose()


def main() -> None:
    claim_stdout()
    job = Job.from_json(sys.stdin.readline())
    result = asyncio.run(run(job))
    send(result.to_json())


if __name__ == "__main__":
    main()
