"""How long until queued work fits: the wait behind Retry-After and deadline refusals.

Admission answers one question for both: how long until ``tokens`` more tokens
fit the budget? Tokens come back when admitted requests end, so the answer
rests on how long a request holds its tokens, which is measured
(``HoldMeter``), and on how long the requests in flight have held theirs
already (``wait_until_fits``):

- a request is expected to hold its tokens for ``a x prompt tokens + b x
  max_tokens`` seconds, a and b fitted (least squares) to the recent releases:
  prefill grows with the prompt, decoding with the tokens generated, and the
  fit learns how much of ``max_tokens`` requests really use. One in flight
  gives its tokens back when its hold is up (at once if it is overdue), so a
  batch that has just started frees nothing for a while, and one that is
  nearly done frees its tokens soon;
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
from collections.abc import Iterable
from dataclasses import dataclass

from stormguard_server.clock import ClockLike, as_clock

__all__ = ["HoldMeter", "HoldModel", "ReleaseSchedule", "wait_until_fits"]

# Releases kept however old they are: a pause (idle, or a restart) must not
# leave the estimate with nothing to go on.
_MIN_SAMPLES = 16
# Below this, prompt and output sizes are taken as proportional (all requests of
# one shape): the two-variable fit is then ill-posed.
_MIN_RELATIVE_DETERMINANT = 1e-6


@dataclass(frozen=True, slots=True)
class HoldModel:
    """Seconds a request holds its tokens: ``per_prompt_s x prompt + per_output_s x
    output`` (both >= 0)."""

    per_prompt_s: float
    per_output_s: float

    def hold_s(self, prompt: int, output: int) -> float:
        return self.per_prompt_s * prompt + self.per_output_s * output


class HoldMeter:
    """Hold times of the requests released in the last ``period_s`` seconds (the
    newest ``_MIN_SAMPLES`` kept however old): a ``HoldModel`` fitted to them, and
    the token-weighted mean hold. Sums are kept as releases come and go, so both
    cost O(1)."""

    def __init__(self, period_s: float, clock: ClockLike | None = None) -> None:
        self._period_s = period_s
        self._clock = as_clock(clock)
        # (release time, tokens, prompt, output bound, seconds held)
        self._releases: deque[tuple[float, int, int, int, float]] = deque()
        # Sums over the releases kept: prompt², output², prompt·output, prompt·hold,
        # output·hold, tokens·hold, tokens, hold.
        self._sums = [0.0] * 8
        self._model: HoldModel | None = None

    def record(self, tokens: int, prompt: int, output: int, held_s: float) -> None:
        """A request of ``prompt`` tokens that could generate ``output`` tokens held its
        ``tokens`` of budget for ``held_s`` seconds."""
        release = (self._clock.now(), tokens, prompt, output, max(0.0, held_s))
        self._releases.append(release)
        self._add(release, 1)
        oldest = release[0] - self._period_s
        while len(self._releases) > _MIN_SAMPLES and self._releases[0][0] < oldest:
            self._add(self._releases.popleft(), -1)
        self._model = None

    def model(self) -> HoldModel | None:
        """The fitted model; None before any release."""
        if self._model is None and self._releases:
            self._model = self._fit()
        return self._model

    def mean_hold_s(self) -> float | None:
        """Mean seconds an admitted token is held (weighted by tokens); None before any
        release."""
        if not self._releases:
            return None
        token_held, tokens, held = self._sums[5], self._sums[6], self._sums[7]
        if tokens <= 0:
            return max(0.0, held) / len(self._releases)
        return max(0.0, token_held) / tokens

    def _add(self, release: tuple[float, int, int, int, float], sign: int) -> None:
        _, tokens, prompt, output, held = release
        sums = self._sums  # the terms in the order of the comment in __init__
        sums[0] += sign * (prompt * prompt)
        sums[1] += sign * (output * output)
        sums[2] += sign * (prompt * output)
        sums[3] += sign * (prompt * held)
        sums[4] += sign * (output * held)
        sums[5] += sign * (tokens * held)
        sums[6] += sign * tokens
        sums[7] += sign * held

    def _fit(self) -> HoldModel:
        """Least squares through the origin on (prompt, output); where that gives a
        negative coefficient, or the sizes are proportional, the one size that
        explains more on its own."""
        pp, oo, po, ph, oh = self._sums[:5]
        det = pp * oo - po * po
        if det > _MIN_RELATIVE_DETERMINANT * pp * oo:
            per_prompt, per_output = (ph * oo - oh * po) / det, (oh * pp - ph * po) / det
            if per_prompt >= 0 and per_output >= 0:
                return HoldModel(per_prompt, per_output)
        by_output = (oh * oh / oo, HoldModel(0.0, max(0.0, oh / oo))) if oo > 0 else None
        by_prompt = (ph * ph / pp, HoldModel(max(0.0, ph / pp), 0.0)) if pp > 0 else None
        # On a tie (proportional sizes) the output wins: decoding is what takes time.
        fits = [fit for fit in (by_output, by_prompt) if fit is not None]
        if not fits:  # only empty requests so far
            return HoldModel(0.0, 0.0)
        return max(fits, key=lambda fit: fit[0])[1]


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
