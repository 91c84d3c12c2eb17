"""How long until queued work fits: the wait behind Retry-After and deadline refusals.

Admission answers one question for both: how long until ``tokens`` more tokens
fit the budget? Tokens come back when admitted requests end, so the answer
rests on how long a request holds its tokens, which is measured
(``HoldMeter``), and on how long the requests in flight have held theirs
already (``wait_until_fits``):

- a request is expected to hold its tokens for its *work* (the tokens it may
  generate, or its whole cost when that is unknown) x the measured seconds per
  unit of work; one in flight releases them when that time is up (at once if
  it is overdue), so a batch that has just started frees nothing for a while,
  and one that is nearly done frees its tokens soon;
- the room a release leaves is taken by the queue, and given back one mean
  hold later: a wait longer than the requests in flight is counted in whole
  turnovers of the budget.

In a steady overload (the budget full, requests of every age in flight) this
is (tokens needed / budget) x the mean hold: the drain rate of Little's law.

Hold times are measured from releases, not over the wall clock, so time with
nothing in flight (idle, or an engine restart) changes nothing: right after a
restart the estimate is what it was before the crash, not one diluted by the
downtime. Releases of requests the engine failed are not measured: a crash
says nothing about how long requests take.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections import deque
from collections.abc import Callable, Iterable

__all__ = ["HoldMeter", "ReleaseSchedule", "wait_until_fits"]

# Releases kept however old they are: a pause (idle, or a restart) must not
# leave the estimate with nothing to go on.
_MIN_SAMPLES = 16


class HoldMeter:
    """Hold times of released requests over a sliding window of ``window_s`` (the
    newest ``_MIN_SAMPLES`` kept however old): seconds per unit of work, and the
    token-weighted mean hold."""

    def __init__(self, window_s: float, clock: Callable[[], float]) -> None:
        self._window_s = window_s
        self._clock = clock
        # (release time, tokens, work, seconds held)
        self._releases: deque[tuple[float, int, int, float]] = deque()
        self._held = 0.0
        self._work = 0
        self._token_held = 0.0
        self._tokens = 0

    def record(self, tokens: int, work: int, held_s: float) -> None:
        """A request that held ``tokens`` for ``held_s`` seconds, for ``work`` units."""
        held_s = max(0.0, held_s)
        now = self._clock()
        self._releases.append((now, tokens, work, held_s))
        self._add(tokens, work, held_s, 1)
        while len(self._releases) > _MIN_SAMPLES and self._releases[0][0] < now - self._window_s:
            _, old_tokens, old_work, old_held = self._releases.popleft()
            self._add(old_tokens, old_work, old_held, -1)

    def seconds_per_work(self) -> float | None:
        """Seconds a request holds its tokens per unit of its work; None before any release."""
        if not self._releases:
            return None
        if self._work <= 0:
            return self.mean_hold_s()  # only zero-work requests so far: one unit each
        return max(0.0, self._held) / self._work

    def mean_hold_s(self) -> float | None:
        """Mean seconds an admitted token is held (weighted by tokens); None before any
        release."""
        if not self._releases:
            return None
        if self._tokens <= 0:
            return max(0.0, self._held) / len(self._releases)
        return max(0.0, self._token_held) / self._tokens

    def _add(self, tokens: int, work: int, held_s: float, sign: int) -> None:
        self._held += sign * held_s
        self._work += sign * work
        self._token_held += sign * tokens * held_s
        self._tokens += sign * tokens


class ReleaseSchedule:
    """The requests in flight in the order they are expected to end: the absolute
    end times (sorted) and the tokens released by each of them, summed. Built once
    per change of the requests in flight or of the hold times; each estimate is then
    a bisection, however many sheds a storm brings between two changes."""

    def __init__(self, requests: Iterable[tuple[float, int]]) -> None:
        """``requests``: (when it is expected to end, its tokens) of each one in flight."""
        ordered = sorted(requests)
        self.ends = [end for end, _ in ordered]
        self.released = list(itertools.accumulate(tokens for _, tokens in ordered))

    @property
    def tokens(self) -> int:
        """Tokens held by the requests in flight."""
        return self.released[-1] if self.released else 0

    def time_covering(self, tokens: int) -> float:
        """When the requests in flight have released ``tokens`` (absolute time)."""
        at = bisect.bisect_left(self.released, tokens)
        return self.ends[min(at, len(self.ends) - 1)]


def wait_until_fits(
    tokens: int, free: int, schedule: ReleaseSchedule, mean_hold_s: float, now: float
) -> float | None:
    """Seconds from ``now`` until ``tokens`` more tokens fit a budget with ``free``
    tokens free now, the requests in flight ending per ``schedule`` (an overdue one
    at once). None when nothing is in flight or free, so nothing can ever come back.
    """
    if tokens <= free:
        return 0.0
    held = schedule.tokens
    released = tokens - free  # what must come back before it fits
    if released <= held:
        return max(0.0, schedule.time_covering(released) - now)
    turnover = held + free  # what comes back in each later round, one mean hold apart
    if turnover <= 0:
        return None
    rounds = math.ceil((released - held) / turnover)
    rest = released - held - (rounds - 1) * turnover
    # In round k, the room free now comes back at k holds, the room the in-flight
    # requests leave at their ends + k holds.
    offset = 0.0 if rest <= free else max(0.0, schedule.time_covering(rest - free) - now)
    return rounds * mean_hold_s + offset
