"""``CubicRate``: a send rate learned from 429s alone, for a provider whose answers
carry no ``x-ratelimit-*`` headers (and, beside the headers, as the cap a 429
puts on a rate they allow: a 429 always wins over a header that says there is
room).

AWS's adaptive retry mode (botocore ``retries/adaptive.py``) made scale-free: off
until the first throttle (the first with a send rate measured: a key is paced
from its first quota signal, so the rate is measured from then); on a throttle,
remember the rate being sent at (``w_max``, this process's measured send rate)
and drop to ``BETA`` times it; then
grow back along a cubic, flat near ``w_max`` and reaching it ``RECOVER_S`` after
the throttle, whatever the rate's scale (botocore's ``C = 0.4`` is in requests per
second; a token rate is thousands), and never above ``MAX_GROWTH`` times the rate
measured being sent (botocore's cap). No lock: ``KeyQuota`` holds its key's.
"""

from __future__ import annotations

import math
from collections import deque

from ._pace_bucket import PaceBucket

__all__ = ["BETA", "MAX_GROWTH", "RECOVER_S", "CubicRate"]

#: The drop on a throttle (botocore's beta).
BETA = 0.7
#: Seconds from a throttle back to the rate it came at.
RECOVER_S = 4.0
#: The rate never exceeds this many times the rate measured being sent (botocore's).
MAX_GROWTH = 2.0
#: Seconds of sends the measured rate is taken over.
_MEASURE_S = 2.0
_KEEP_S = 10.0
_MAX_SENDS = 4096
#: The least rate, as a fraction of ``w_max``.
_FLOOR = 0.05


class CubicRate:
    """One key's send rate, in cost per second, from its throttles."""

    __slots__ = ("_bucket", "_sends", "on", "t_throttle", "w_max")

    def __init__(self) -> None:
        #: Whether a throttle has been seen (before it, no pacing at all).
        self.on = False
        self.w_max = 0.0
        self.t_throttle = -math.inf
        self._sends: deque[tuple[float, float]] = deque(maxlen=_MAX_SENDS)
        self._bucket = PaceBucket()

    def measured(self, now: float) -> float:
        """This process's send rate over the last ``_MEASURE_S`` seconds."""
        while self._sends and self._sends[0][0] < now - _KEEP_S:
            self._sends.popleft()
        return sum(c for t, c in self._sends if t > now - _MEASURE_S) / _MEASURE_S

    def rate(self, now: float) -> float:
        x = 1.0 - (now - self.t_throttle) / RECOVER_S
        cubic = self.w_max * (1.0 - (1.0 - BETA) * x**3) if x > -8 else math.inf
        ceiling = max(MAX_GROWTH * self.measured(now), self.w_max)
        return max(self.w_max * _FLOOR, min(cubic, ceiling))

    def throttled(self, now: float, t_send: float) -> bool:
        """A 429 for the request sent at ``t_send``: the rate drops (once per round:
        a refusal of a request sent before the last drop is old news). Returns
        whether it dropped."""
        if t_send < self.t_throttle:
            return False
        measured = self.measured(now)
        if not self.on and measured <= 0:
            # The first 429 of a key this process has not paced yet: no rate of its
            # own to drop from. Its sends are measured from now, for the next one.
            self.t_throttle = now
            return False
        current = self.rate(now) if self.on else measured
        self.w_max = max(1e-3, min(current, measured) if measured > 0 else current)
        if not self.on:
            self._bucket.start(now)
        self.on = True
        self.t_throttle = now
        return True

    def wait(self, now: float, cost: float) -> float:
        """Seconds until the local bucket holds ``cost`` (0: now, or not on)."""
        if not self.on:
            return 0.0
        return self._bucket.wait(now, self.rate(now), cost)

    def take(self, now: float, cost: float) -> None:
        self._sends.append((now, cost))
        if self.on:
            self._bucket.take(cost)

    def sent(self, now: float, cost: float) -> None:
        """A send granted elsewhere (a shared bucket): measured, not taken locally."""
        self._sends.append((now, cost))

    def give_back(self, cost: float) -> None:
        if self._sends:
            t, c = self._sends.pop()
            if c != cost:
                self._sends.append((t, c))
        if self.on:
            self._bucket.give_back(cost)

    def hold(self, until: float) -> None:
        """A 429's pause: the local bucket saves nothing up until ``until``."""
        if self.on:
            self._bucket.hold(until)
