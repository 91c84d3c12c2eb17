"""The figures of each fault of a fleet pairing: the sick shares, the dead replica,
the replica in the crash loop and the slow one (definitions: ``fleet/summary.py``).

Each returns its part of the pairing's JSON entry, or None when the timeline has no
such fault.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from stormguard_drill.figures import counter_at, round_or_none
from stormguard_drill.fleet.client_records import attempts_within, ejected_after, sick_share
from stormguard_drill.fleet.config import FleetTimeline
from stormguard_drill.fleet.records import FleetRun
from stormguard_drill.fleet.replica_series import ATTEMPTS, down_intervals
from stormguard_drill.records import LogicalResult


def sick_shares(
    run: FleetRun, timeline: FleetTimeline, recover: float
) -> dict[str, dict[str, Any]]:
    """Per fault kind: of the calls started from one second after the fault began until
    ``recover``, those that sent an attempt to the sick replica, and the attempts it
    counted itself over that time."""
    shares: dict[str, dict[str, Any]] = {}
    for fault in timeline.faults:
        address = run.addresses[fault.replica]
        since = fault.start_s + 1.0
        calls, touched = sick_share(run.results, run.attempts, address, since, recover)
        samples = run.replica_samples[fault.replica]
        served = counter_at(samples, ATTEMPTS, recover) - counter_at(samples, ATTEMPTS, since)
        shares[fault.kind] = {
            "replica": fault.replica,
            "from_s": since,
            "to_s": recover,
            "calls": calls,
            "touched": touched,
            "share": round_or_none(touched / calls if calls else None, 4),
            "server_attempts": round(served),
        }
    return shares


def dead_replica_figures(
    run: FleetRun, timeline: FleetTimeline, ok: Sequence[LogicalResult], end_s: float
) -> dict[str, Any] | None:
    """While the replica was dead (from the kill until its restart began): the attempts
    it counted, those the clients sent it, the calls it answered; and how long after
    the kill each client process took it out of rotation."""
    dead = timeline.fault("dead")
    if dead is None:
        return None
    log = run.faults
    samples = run.replica_samples[dead.replica]
    killed, back = log.killed_s, log.restarted_s
    address = run.addresses[dead.replica]
    while_dead = sent_while_dead = answered_while_dead = None
    if killed is not None:
        until = log.restart_begun_s if log.restart_begun_s is not None else end_s
        while_dead = round(
            counter_at(samples, ATTEMPTS, until) - counter_at(samples, ATTEMPTS, killed)
        )
        sent_while_dead = sum(
            1
            for record in run.attempts.values()
            for t, where in record
            if where == address and killed <= t < until
        )
        # A successful call's last attempt is the one that answered.
        answered_while_dead = sum(
            1
            for r in ok
            if (last := run.attempts.get(r.index))
            and last[-1][1] == address
            and killed <= last[-1][0] < until
        )
    return {
        "replica": dead.replica,
        "killed_s": killed,
        "back_s": back,
        "port_refused": log.dead_port_refused,
        "server_attempts_while_dead": while_dead,
        "client_attempts_while_dead": sent_while_dead,
        "answered_while_dead": answered_while_dead,
        "ejected_after_s": [] if killed is None else ejected_after(run, address, killed),
    }


def crash_loop_figures(
    run: FleetRun, timeline: FleetTimeline, replicas: Sequence[dict[str, Any]]
) -> dict[str, Any] | None:
    """The crashes sent and counted, how long the engine was not ready, and the
    attempts the clients sent it meanwhile; ``replicas`` are the per-replica figures."""
    loop = timeline.fault("crash_loop")
    if loop is None:
        return None
    log = run.faults
    down = down_intervals(run.replica_samples[loop.replica])
    loop_address = run.addresses[loop.replica]
    return {
        "replica": loop.replica,
        "crashes_sent": len(log.crashes_sent_s),
        "crashes_sent_s": log.crashes_sent_s,
        "back_s": log.loop_back_s,
        "crashes_counted": replicas[loop.replica]["crashes"],
        "restart_loops": replicas[loop.replica]["restart_loops"],
        "down_s": round(sum(b - a for a, b in down), 2),
        "client_attempts_while_down": attempts_within(run.attempts, loop_address, down),
    }


def slow_replica_figures(run: FleetRun, timeline: FleetTimeline) -> dict[str, Any] | None:
    """The latency added and when it was set and cleared."""
    slow = timeline.fault("slow")
    if slow is None:
        return None
    log = run.faults
    return {
        "replica": slow.replica,
        "added_latency_ms": timeline.slow_latency_ms,
        "set_s": log.slow_set_s,
        "cleared_s": log.slow_cleared_s,
    }
