"""The fleet's replicas and the faults of its timeline, done at their times.

``Replicas`` starts a pairing's replicas (each a reference server with its admin
endpoint), samples each one's /metrics, and can kill one and start it again on the
same port. A replica's counters restart from zero in its new process: its samples are
kept as one series, the new process's counters added to the old one's last values.

``run_timeline`` does the faults (``fleet/config.py``) at their times and records when
each was done (``FaultLog``):

- ``dead``: a last scrape, then SIGKILL; the port is then held by a socket that is
  bound but not listening, so a connection is refused at once (as to a dead host's
  closed port) and no other program on the machine is handed the port meanwhile;
- ``crash_loop``: ``POST /admin/crash``; once ``/ready`` says the engine is back,
  ``loop_up_s`` later, the next crash; until the recovery;
- ``slow``: ``POST /admin/faults {"added_latency_ms": ...}``;
- recovery, all at once: the dead replica restarted on its port (its new process
  listens before the holding socket is closed), the crash loop stopped (a cold start
  under way ends on its own), the latency set back to 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from dataclasses import dataclass, field

import httpx

from stormguard_drill.app import sleep_until
from stormguard_drill.fleet.config import Fault, FleetTimeline
from stormguard_drill.fleet.records import FaultLog, Samples
from stormguard_drill.sampler import MetricsSampler
from stormguard_drill.servers import ServerFleet, ServerProcess, free_port

_READY_POLL_S = 0.05


@dataclass
class _Replica:
    index: int
    server: ServerProcess
    sampler: MetricsSampler | None = None
    task: asyncio.Task[None] | None = None
    samples: Samples = field(default_factory=list)  # earlier processes', offset
    offset: dict[str, float] = field(default_factory=dict)  # their counters' last values
    holder: socket.socket | None = None  # the dead replica's port, held closed


class Replicas:
    """One pairing's replicas, their ports chosen at once (the clients can be told them
    before the servers are up); ``stop()`` stops them all (and their samplers)."""

    def __init__(
        self, servers: ServerFleet, label: str, server_args: tuple[str, ...], count: int
    ) -> None:
        self._servers = servers
        self._label = label
        self._args = server_args
        self._ports = _free_ports(count)
        self._replicas: list[_Replica] = []
        self._t0 = 0.0
        self._hz = 4.0

    async def start(self) -> None:
        started = await asyncio.gather(
            *(self._start(f"{self._label}-r{i}", port) for i, port in enumerate(self._ports)),
            return_exceptions=True,
        )
        for i, server in enumerate(started):
            if isinstance(server, ServerProcess):
                self._replicas.append(_Replica(i, server))
        failed = [s for s in started if isinstance(s, BaseException)]
        if failed:
            raise failed[0]

    async def _start(self, name: str, port: int | None = None) -> ServerProcess:
        return await self._servers.start(name, *self._args, admin=True, port=port)

    @property
    def base_urls(self) -> list[str]:
        return [f"http://127.0.0.1:{port}/v1" for port in self._ports]

    @property
    def addresses(self) -> list[str]:
        """Each replica's "host:port", as the attempt records name it."""
        return [f"127.0.0.1:{port}" for port in self._ports]

    def server(self, index: int) -> ServerProcess:
        return self._replicas[index].server

    def sample(self, t0: float, hz: float) -> None:
        """Start sampling every replica, times from ``t0``."""
        self._t0, self._hz = t0, hz
        for replica in self._replicas:
            self._begin(replica)

    def _begin(self, replica: _Replica) -> None:
        replica.sampler = MetricsSampler(replica.server.root, self._t0, self._hz)
        replica.task = asyncio.create_task(replica.sampler.run())

    async def _end(self, replica: _Replica) -> None:
        """Stop sampling the replica's process, after one last scrape."""
        if replica.task is not None:
            replica.task.cancel()
            await asyncio.gather(replica.task, return_exceptions=True)
            replica.task = None
        if replica.sampler is not None and replica.server.process.poll() is None:
            await replica.sampler.final()

    def samples(self, index: int) -> Samples:
        """The replica's samples over every process it had, counters made continuous."""
        replica = self._replicas[index]
        current = [] if replica.sampler is None else replica.sampler.samples
        return [*replica.samples, *_offset(current, replica.offset)]

    async def kill(self, index: int) -> None:
        """Kill the replica's process (a last scrape first) and hold its port closed."""
        replica = self._replicas[index]
        await self._end(replica)
        replica.server.process.kill()
        await asyncio.to_thread(replica.server.process.wait)
        replica.holder = _hold(replica.server.port)
        self._retire(replica)

    async def refused(self, index: int) -> bool:
        """Whether a connection to the replica's port is refused now."""
        return await _refused(self._replicas[index].server.port)

    def _retire(self, replica: _Replica) -> None:
        """File the ended process's samples and counters under the replica."""
        current = [] if replica.sampler is None else replica.sampler.samples
        shifted = _offset(current, replica.offset)
        replica.samples.extend(shifted)
        if shifted:
            last = shifted[-1][1]
            replica.offset = {k: v for k, v in last.items() if _is_counter(k)}
        replica.sampler = None
        self._servers.stop(replica.server)

    async def restart(self, index: int) -> None:
        """The killed replica again, a new process on its port, sampled from its start
        (a sample now says that the new process has counted nothing yet)."""
        replica = self._replicas[index]
        replica.samples.append((time.monotonic() - self._t0, dict(replica.offset)))
        server = await self._start(f"{replica.server.name}-restarted", replica.server.port)
        replica.server = server
        if replica.holder is not None:
            replica.holder.close()
            replica.holder = None
        self._begin(replica)

    async def stop(self) -> None:
        """Stop every replica (a last scrape first), all at once; again: nothing more
        happens."""
        await asyncio.gather(*(self._end(replica) for replica in self._replicas))
        for replica in self._replicas:
            if replica.holder is not None:
                replica.holder.close()
                replica.holder = None
        # Each stop waits for its process's graceful exit: in threads, side by side.
        await asyncio.gather(
            *(asyncio.to_thread(self._servers.stop, r.server) for r in self._replicas)
        )


def _free_ports(count: int) -> list[int]:
    """``count`` distinct ports free on 127.0.0.1 now."""
    ports: list[int] = []
    while len(ports) < count:
        port = free_port()
        if port not in ports:
            ports.append(port)
    return ports


def _is_counter(name: str) -> bool:
    return "_total" in name


def _offset(samples: Samples, offset: dict[str, float]) -> Samples:
    """``samples`` with ``offset`` added to their counters; a counter a sample lacks (a
    labelled counter has no series before its first count) is the offset alone."""
    if not offset:
        return list(samples)
    return [
        (t, {**values, **{k: values.get(k, 0.0) + v for k, v in offset.items()}})
        for t, values in samples
    ]


def _hold(port: int) -> socket.socket:
    """A socket bound to ``port`` that never listens: connections to it are refused,
    and the kernel hands the port to no one else (a restarted server still binds it:
    it sets SO_REUSEADDR, as this socket does)."""
    holder = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    holder.bind(("127.0.0.1", port))
    return holder


async def _refused(port: int) -> bool:
    """Whether a connection to ``port`` is refused now."""
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 2.0)
    except ConnectionRefusedError:
        return True
    except (OSError, asyncio.TimeoutError):
        return False
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return False


async def _post(http: httpx.AsyncClient, server: ServerProcess, path: str, body: object) -> None:
    response = await http.post(server.admin_url(path), json=body, headers=server.admin_headers)
    response.raise_for_status()


async def _ready(http: httpx.AsyncClient, server: ServerProcess) -> bool:
    with contextlib.suppress(httpx.HTTPError):
        return (await http.get(f"{server.root}/ready")).status_code == 200
    return False


async def _until_ready(http: httpx.AsyncClient, server: ServerProcess, ready: bool) -> None:
    """Poll ``/ready`` until it says ``ready`` (another process: nothing to wait on)."""
    while True:
        if await _ready(http, server) == ready:
            return
        await asyncio.sleep(_READY_POLL_S)


async def _crash_loop(
    http: httpx.AsyncClient, replicas: Replicas, fault: Fault, t0: float, up_s: float, log: FaultLog
) -> None:
    """Crash the replica's engine, wait until it is ready again, ``up_s`` more, crash it
    again; until cancelled (the recovery)."""
    server = replicas.server(fault.replica)
    while True:
        log.crashes_sent_s.append(round(time.monotonic() - t0, 3))
        await _post(http, server, "/admin/crash", {})
        await _until_ready(http, server, False)  # the engine takes the crash at its next step
        await _until_ready(http, server, True)
        log.loop_back_s.append(round(time.monotonic() - t0, 3))
        await asyncio.sleep(up_s)


async def run_timeline(
    replicas: Replicas, timeline: FleetTimeline, t0: float, log: FaultLog
) -> None:
    """Every fault at its time, then the recovery; a fault that cannot be done is noted
    in ``log.errors`` (the pairing goes on, and the report says so)."""
    loops: list[asyncio.Task[None]] = []
    dead: Fault | None = None
    slow: Fault | None = None
    async with httpx.AsyncClient(timeout=10.0) as http:
        try:
            for fault in timeline.faults:
                await sleep_until(t0 + fault.start_s)
                try:
                    if fault.kind == "dead":
                        await replicas.kill(fault.replica)
                        log.killed_s = round(time.monotonic() - t0, 3)
                        log.dead_port_refused.append(await replicas.refused(fault.replica))
                        dead = fault
                    elif fault.kind == "crash_loop":
                        up_s = timeline.loop_up_s
                        loop = _crash_loop(http, replicas, fault, t0, up_s, log)
                        loops.append(asyncio.create_task(loop))
                    else:
                        server = replicas.server(fault.replica)
                        body = {"added_latency_ms": timeline.slow_latency_ms}
                        await _post(http, server, "/admin/faults", body)
                        log.slow_set_s = round(time.monotonic() - t0, 3)
                        slow = fault
                except (httpx.HTTPError, OSError, RuntimeError) as exc:
                    log.errors.append(f"{fault.kind} at {fault.start_s} s: {exc!r}")
            await sleep_until(t0 + timeline.recover_at_s)
            log.recovered_s = round(time.monotonic() - t0, 3)
            for task in loops:
                task.cancel()
            await asyncio.gather(*loops, return_exceptions=True)
            for task in loops:
                if not task.cancelled() and task.exception() is not None:
                    log.errors.append(f"crash loop: {task.exception()!r}")
            await asyncio.gather(
                _clear_latency(http, replicas, slow, t0, log),
                _restart(replicas, dead, t0, log),
            )
        finally:
            for task in loops:
                task.cancel()
            await asyncio.gather(*loops, return_exceptions=True)


async def _clear_latency(
    http: httpx.AsyncClient, replicas: Replicas, slow: Fault | None, t0: float, log: FaultLog
) -> None:
    if slow is None:
        return
    try:
        await _post(http, replicas.server(slow.replica), "/admin/faults", {"added_latency_ms": 0})
        log.slow_cleared_s = round(time.monotonic() - t0, 3)
    except httpx.HTTPError as exc:
        log.errors.append(f"clearing the latency: {exc!r}")


async def _restart(replicas: Replicas, dead: Fault | None, t0: float, log: FaultLog) -> None:
    if dead is None:
        return
    log.dead_port_refused.append(await replicas.refused(dead.replica))
    log.restart_begun_s = round(time.monotonic() - t0, 3)
    try:
        await replicas.restart(dead.replica)
        log.restarted_s = round(time.monotonic() - t0, 3)
    except (OSError, RuntimeError, TimeoutError) as exc:
        log.errors.append(f"restarting the dead replica: {exc!r}")
