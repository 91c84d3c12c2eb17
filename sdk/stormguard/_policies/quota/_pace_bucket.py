"""``PaceBucket``: the local token bucket a process paces its sends to one key with.

It fills at whatever rate its owner says at each ask (the share of the key's rate,
or the 429-learned rate), holds at most half a second of it (or one call, if
larger), and may go into debt: a grant takes its cost at once, and the calls
behind it wait for the debt to be paid. A 429's pause ``hold``s it: it does not
fill while no call may go, so the end of the pause releases calls at the rate,
not half a second's worth at once (letting one go as it ends cost 0.05 x the
wall time in simulation: every paused process's first call, at once). No lock:
``KeyQuota`` holds its key's.
"""

from __future__ import annotations

__all__ = ["PaceBucket"]

#: Seconds of the rate the bucket holds at most.
BURST_S = 0.5


class PaceBucket:
    """A token bucket whose rate is given at each ask."""

    __slots__ = ("level", "since")

    def __init__(self) -> None:
        self.level = 0.0
        #: When the level was last brought up to date (in the future while held).
        self.since = 0.0

    def start(self, now: float) -> None:
        """Empty, filling from ``now``."""
        self.level, self.since = 0.0, now

    def wait(self, now: float, rate: float, cost: float) -> float:
        """Seconds until the bucket holds ``cost`` at ``rate`` (0: now)."""
        cap = max(cost, rate * BURST_S)
        if self.level < cap and now > self.since:
            self.level = min(cap, self.level + (now - self.since) * rate)
        self.since = max(self.since, now)
        held = self.since - now
        return held + (0.0 if self.level >= cost else (cost - self.level) / rate)

    def take(self, cost: float) -> None:
        self.level -= cost

    def give_back(self, cost: float) -> None:
        self.level += cost

    def hold(self, until: float) -> None:
        """No filling before ``until`` (a 429's pause), and nothing saved up."""
        self.level = min(self.level, 0.0)
        self.since = max(self.since, until)
