"""Faults of the simulated engine, switchable at run time.

One mutable object holds them so that the CLI flags set the initial values,
the admin endpoint changes them while the server runs, and the engine reads
them once per request or per step. It decides nothing by itself beyond the
coin flips of the random error and hang rates.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from stormguard_server.clock import ClockLike, as_clock
from stormguard_server.config import FaultConfig


@dataclass(frozen=True, slots=True)
class FaultSnapshot:
    """The faults in force, as the admin endpoint reports them."""

    error_rate: float
    hang_rate: float
    added_latency_s: float
    stall_remaining_s: float
    oom_crash: bool
    crash_pending: bool


class FaultState:
    """Current faults; ``clock`` is injectable for tests."""

    def __init__(
        self,
        config: FaultConfig | None = None,
        *,
        oom_crash: bool = True,
        clock: ClockLike | None = None,
    ) -> None:
        config = config or FaultConfig()
        self._clock = as_clock(clock)
        self._rng = random.Random(config.seed)
        self.error_rate = 0.0
        self.hang_rate = 0.0
        self.added_latency_s = 0.0
        self.oom_crash = oom_crash
        self._stall_until = 0.0
        self._crash_pending = False
        self.set_error_rate(config.error_rate)
        self.set_hang_rate(config.hang_rate)
        self.set_added_latency(config.added_latency_s)
        if config.stall_s > 0:
            self.stall(config.stall_s)

    def set_error_rate(self, rate: float) -> None:
        """Fraction of requests that fail with an injected engine error."""
        if not 0.0 <= rate <= 1.0:
            raise ValueError("error rate must be within 0..1")
        self.error_rate = rate

    def set_hang_rate(self, rate: float) -> None:
        """Fraction of requests that hang without an answer (see ``should_hang``)."""
        if not 0.0 <= rate <= 1.0:
            raise ValueError("hang rate must be within 0..1")
        self.hang_rate = rate

    def set_added_latency(self, seconds: float) -> None:
        """Extra delay before each request enters the engine."""
        if not 0.0 <= seconds <= 3600.0:
            raise ValueError("added latency must be within 0..3600 s")
        self.added_latency_s = seconds

    def stall(self, seconds: float) -> None:
        """Freeze the engine loop (no steps at all) for ``seconds``; 0 ends a stall."""
        if not 0.0 <= seconds <= 3600.0:
            raise ValueError("stall must be within 0..3600 s")
        self._stall_until = self._clock.now() + seconds if seconds > 0 else 0.0

    def stall_remaining(self) -> float:
        """Seconds left in the current stall (0 when not stalled)."""
        return max(0.0, self._stall_until - self._clock.now())

    def request_crash(self) -> None:
        """Crash the engine at its next step, as if it had run out of memory."""
        self._crash_pending = True

    def take_crash_request(self) -> bool:
        """True once after ``request_crash``: the engine consumes the request."""
        pending, self._crash_pending = self._crash_pending, False
        return pending

    def should_inject_error(self) -> bool:
        """Flip the error-rate coin for one request."""
        return self.error_rate > 0 and self._rng.random() < self.error_rate

    def should_hang(self) -> bool:
        """Flip the hang coin for one request (after the error coin: a request that
        fails is not also held)."""
        return self.hang_rate > 0 and self._rng.random() < self.hang_rate

    def snapshot(self) -> FaultSnapshot:
        """The faults in force now."""
        return FaultSnapshot(
            error_rate=self.error_rate,
            hang_rate=self.hang_rate,
            added_latency_s=self.added_latency_s,
            stall_remaining_s=self.stall_remaining(),
            oom_crash=self.oom_crash,
            crash_pending=self._crash_pending,
        )
