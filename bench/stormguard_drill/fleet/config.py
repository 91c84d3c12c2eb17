"""The fleet scenario's knobs: replicas, client processes, the workload and the timeline.

A partial outage as the incident write-ups open: several replicas behind several
client processes, and faults that pile up one after another on a timeline:

1. steady traffic, every replica healthy;
2. one replica **dead**: its process killed, its port closed (connections refused);
3. one replica in an **OOM restart loop**: its engine crashed through the admin
   endpoint, and crashed again ``loop_up_s`` after each time it comes back, so it keeps
   failing its streams and answering 503 while cold (``POST /admin/crash`` rather than
   long prompts: the fault is then the same for every pairing, whichever client sends
   what where);
4. one replica **slow**: ``added_latency_ms`` before each request enters its engine;
5. **recovery**: the dead replica restarted on the same port, the crash loop stopped,
   the latency cleared; then the traffic's rebound onto the whole fleet.

The faults stay until the recovery (at the worst, one replica of four is healthy), so
a client is judged on each new fault while the earlier ones still hold. The presets
change how long each phase lasts and the arrival rate, never the engine, the prompt
shape or the order of the faults.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from stormguard_drill.config import ENGINE_ARGS, FleetWorkload, Mode, Patience, PromptShape

FaultKind = Literal["dead", "crash_loop", "slow"]
FAULT_KINDS: tuple[FaultKind, ...] = ("dead", "crash_loop", "slow")

# The avalanche's engine (8192 KV tokens, 32 sequences, 8 ms steps, a 3 s cold start,
# a 2 s slow start): every replica the same. The drill's short calls never fill it; a
# replica fails here only by the faults of the timeline.
FLEET_ENGINE_ARGS: tuple[str, ...] = ENGINE_ARGS
# Short chat calls (~0.3 s each on an idle replica): the fleet's CPU goes to the
# seven processes of a pairing (4 replicas, 3 client processes) on two cores, not to
# long streams.
FLEET_SHAPE = PromptShape(min_prompt_tokens=30, max_prompt_tokens=90, max_tokens=32)
# The caller's patience (the partial-outage write-up's 10 s timeout): a call gets 10 s
# from its client, and after a final failure the application calls once more after 1 s,
# as in the avalanche; a crash cuts the streams running on the looping replica, which
# no client resumes. The caller gives up 30 s after issuing a logical request.
FLEET_PATIENCE = Patience(timeout_s=10.0, app_retry_pause_s=1.0, app_retries=1, deadline_s=30.0)


@dataclass(frozen=True, slots=True)
class Fault:
    """One replica's fault, from ``start_s`` until the fleet's recovery."""

    kind: FaultKind
    replica: int
    start_s: float


@dataclass(frozen=True, slots=True)
class FleetTimeline:
    """The faults in the order they start, then the recovery (times from the start of a
    pairing)."""

    faults: tuple[Fault, ...]
    recover_at_s: float
    # The looping replica is crashed again this long after it is ready again.
    loop_up_s: float = 0.5
    slow_latency_ms: float = 2000.0

    def fault(self, kind: FaultKind) -> Fault | None:
        return next((f for f in self.faults if f.kind == kind), None)


@dataclass(frozen=True, slots=True)
class FleetTargets:
    """What the default stormguard client should reach in the fleet (every pairing is
    checked; ``missed`` names the misses)."""

    min_success: float = 0.999
    max_attempts_per_call: float = 1.1  # attempts counted at the live replicas / calls
    max_dead_share: float = 0.01  # calls sent to the dead replica after its first second
    # p99 latency no worse than LiteLLM Router's in the same run (x 1.0).
    max_p99_over_router: float = 1.0


@dataclass(frozen=True, slots=True)
class FleetConfig:
    mode: Mode
    seed: int
    replicas: int
    processes: int
    workload: FleetWorkload
    timeline: FleetTimeline
    patience: Patience = FLEET_PATIENCE
    targets: FleetTargets = FleetTargets()
    sample_hz: float = 4.0
    engine_args: tuple[str, ...] = FLEET_ENGINE_ARGS
    scenario: Literal["fleet"] = "fleet"


def _timeline(dead: float, loop: float, slow: float, recover: float) -> FleetTimeline:
    faults = (Fault("dead", 0, dead), Fault("crash_loop", 1, loop), Fault("slow", 2, slow))
    return FleetTimeline(faults=faults, recover_at_s=recover)


# (dead, crash loop, slow, recovery, end of the load) in seconds, and the arrival rate.
# The crash loop lasts over two cold starts (3 s each) plus their 0.5 s up: two crashes
# or more in every mode, with 1.4 s to spare in the tiny one; and every fault has at
# least a second after its first (the sick shares count from there).
_PHASES: dict[Mode, tuple[tuple[float, float, float, float, float], float]] = {
    "full": ((10.0, 20.0, 30.0, 40.0, 55.0), 12.0),
    "quick": ((4.0, 8.0, 14.0, 18.0, 24.0), 12.0),
    # For the end-to-end test only: proves the machinery, shows nothing.
    "tiny": ((0.5, 1.0, 4.5, 6.5, 7.5), 6.0),
}
_GRACE_S = FLEET_PATIENCE.deadline_s or FLEET_PATIENCE.timeout_s


def fleet_preset(mode: Mode, *, seed: int = 0) -> FleetConfig:
    """The fleet at one size: 4 replicas (one each dead, looping, slow; one healthy) and
    3 client processes."""
    (dead, loop, slow, recover, end), rate = _PHASES[mode]
    return FleetConfig(
        mode=mode,
        seed=seed,
        replicas=4,
        processes=3,
        workload=FleetWorkload(
            duration_s=end, rate=rate, grace_s=_GRACE_S + 2.0, shape=FLEET_SHAPE
        ),
        timeline=_timeline(dead, loop, slow, recover),
    )
