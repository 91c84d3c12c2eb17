"""The total time budget of one logical call: every attempt and every sleep."""

from __future__ import annotations

import math

from ._clock import Clock

__all__ = ["Deadline"]

# An attempt given less than this is not worth sending: no LLM server answers a
# request in under 1 ms, so sending it would only add load.
MIN_ATTEMPT_TIME = 0.001


class Deadline:
    """A point on the clock after which the caller no longer wants an answer."""

    __slots__ = ("_clock", "at", "timeout")

    def __init__(self, clock: Clock, timeout: float | None) -> None:
        if timeout is not None and (math.isnan(timeout) or timeout <= 0):
            raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
        self._clock = clock
        self.timeout = timeout
        self.at = math.inf if timeout is None else clock.now() + timeout

    def remaining(self) -> float:
        """Seconds left (``inf`` without a timeout, never negative)."""
        return max(self.at - self._clock.now(), 0.0)

    @property
    def expired(self) -> bool:
        return self.remaining() < MIN_ATTEMPT_TIME

    def allows_sleep(self, seconds: float) -> bool:
        """Whether sleeping ``seconds`` still leaves time for an attempt afterwards."""
        return self.remaining() - seconds >= MIN_ATTEMPT_TIME
