"""What one pairing of the fleet measured (``FleetRun``), and the records in it: each
replica's metric samples, when each fault was done (``FaultLog``), stormguard's
ejections. Records only: the figures (``fleet/summary.py`` and the modules it reads) import
this, never the runner that filled it."""

from __future__ import annotations

from dataclasses import dataclass, field

from stormguard_drill.clients.drill_client import ClientName
from stormguard_drill.records import Admission, LogicalResult

Samples = list[tuple[float, dict[str, float]]]

# (seconds from t0, "host:port", status before, status after, why): stormguard's
# ejections and returns of endpoints.
Ejection = tuple[float, str, str, str, str]


@dataclass
class FaultLog:
    """When each fault was done, seconds from the pairing's start."""

    killed_s: float | None = None
    # The dead replica's port refused a connection right after the kill and right
    # before the restart (checked by the drill itself).
    dead_port_refused: list[bool] = field(default_factory=list)
    restart_begun_s: float | None = None  # the dead replica's new process spawned
    restarted_s: float | None = None  # ... and ready
    crashes_sent_s: list[float] = field(default_factory=list)
    loop_back_s: list[float] = field(default_factory=list)  # the looping engine ready again
    slow_set_s: float | None = None
    recovered_s: float | None = None  # the recovery begun (all three at once)
    slow_cleared_s: float | None = None
    errors: list[str] = field(default_factory=list)  # faults that could not be done


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
