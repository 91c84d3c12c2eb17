"""``ShareController``: one dimension (tokens or requests) of one key's quota, as
one process paces it from the provider's ``x-ratelimit-*`` headers.

The provider's ``remaining`` (R) is the level of ONE bucket shared by every
process on the key; its ``limit`` (L) / 60 s is the bucket's refill rate rho. A
process cannot see the others, but it can measure its **share** of what the key
spends: over a window of its own observations, each stamped with the send time
of the request it answered (when the provider charged it), the key spent
D = R_first - R_last + rho * (t_last - t_first), while this process's requests
admitted in that interval cost S: its share is f = S / D. Every process measuring
so gets shares that sum to about 1, whatever their number. (A process that sends
less than once a window keeps its last two readings, up to ``_SPARSE`` windows;
the answers to a burst sent before it paced are measured from only as
``_measure`` says.)

The key as a whole may spend A = rho + (R - low) / drain per second: the refill,
plus the surplus above a small reserve (``low``) spent over ``drain`` seconds; below
the reserve, less than rho, so the bucket refills to it. This process paces its
sends to f * A with a local token bucket holding at most half a second of its rate.

Before any share is measured, the headers give a guess: what this process's
requests were charged / what the key has spent (L - the lowest R seen). A
measured share moves halfway to each new measurement (noise); a share not
measured for a window (this process sent little, so saw little) doubles per
window of silence, so a process never starves on an old low share. Ported from
the prototype chosen in simulation (docs/quotas.md).

Without headers, a 429's message is the only word of the key: its limit and its
level then. Nothing is measured between 429s; the share is ``RefusalShare``'s
(started from what this process sent before, cut on each 429) and the key's rate
is its refill. No lock: ``KeyQuota`` holds its key's.
"""

from __future__ import annotations

import math
from collections import deque

from ..limiter.aimd import MAX_PAUSE_S
from ._pace_bucket import PaceBucket
from ._refusal_share import RefusalShare

__all__ = ["MIN_SHARE", "SOFTNESS", "STALE_S", "ShareController"]

#: The least share: 256 processes on one key.
MIN_SHARE = 1 / 256
#: Below the reserve the key is paced at rho * (1 - SOFTNESS * shortfall / reserve),
#: never under a tenth of rho.
SOFTNESS = 0.5
#: Observations and admitted sends kept (each also by time: a window, two windows).
_MAX_SAMPLES = 512
#: Seconds a dimension paces on its last answer: past them without another, it
#: paces nothing until the next (one answer, however wrong, holds calls no longer).
STALE_S = MAX_PAUSE_S
#: A bucket at 98 % of its limit or more wastes its refill: no share is measured on it.
_FULL = 0.98
#: A reading older than a window is kept for a second one up to this many windows.
_SPARSE = 3.0


class ShareController:
    """One dimension of one key's quota: what the provider said, this process's
    measured share of it, and the local bucket that paces this process's sends."""

    __slots__ = (
        "_admitted",
        "_bucket",
        "_burst",
        "_burst_charged",
        "_charged",
        "_drain",
        "_from_refusals",
        "_low_fraction",
        "_lowest",
        "_measured",
        "_obs",
        "_observed_t",
        "_paced_from",
        "_window",
        "limit",
        "refusals",
        "remaining",
        "remaining_t",
        "rho",
        "sent_total",
        "share",
        "share_t",
    )

    def __init__(self, *, window: float, drain: float, reserve: float) -> None:
        self._window = window
        self._drain = drain
        self._low_fraction = reserve
        #: The key's limit per minute (None: no header seen yet).
        self.limit: float | None = None
        #: Its refill per second (limit / 60).
        self.rho = 0.0
        #: The key's last ``remaining``, and the send time it answered.
        self.remaining = 0.0
        self.remaining_t = -math.inf
        self._observed_t = -math.inf
        self._paced_from = -math.inf
        #: The readings of the answers to requests sent before this process paced
        #: the key, and what those requests were charged.
        self._burst: list[tuple[float, float]] = []
        self._burst_charged = 0.0
        self._obs: deque[tuple[float, float]] = deque(maxlen=_MAX_SAMPLES)
        self._admitted: deque[tuple[float, float]] = deque(maxlen=_MAX_SAMPLES)
        #: This process's share of the key, and the send time it was measured at.
        self.share = 1.0
        self.share_t = 0.0
        self._measured = False
        self._from_refusals = False
        #: The share paced to while only 429s read the key (no headers).
        self.refusals = RefusalShare()
        self._bucket = PaceBucket()
        #: Own spend granted, and charged (answers with headers), for the guess.
        self.sent_total = 0.0
        self._charged = 0.0
        self._lowest = math.inf

    @property
    def from_headers(self) -> bool:
        """Whether the last word of this dimension came from headers (not a 429's
        message)."""
        return self.limit is not None and not self._from_refusals

    @property
    def known(self) -> bool:
        """Whether a header has told this dimension its limit."""
        return self.limit is not None

    def paces(self, now: float) -> bool:
        """Whether this dimension paces calls now: its limit is known, and its last
        answer is at most ``STALE_S`` old."""
        return self.limit is not None and now - self._observed_t <= STALE_S

    def observe(
        self,
        t_send: float,
        now: float,
        limit: float,
        remaining: float,
        admitted: float,
        *,
        refusal: bool = False,
    ) -> bool:
        """One response's ``limit`` and ``remaining`` for the request sent at ``t_send``
        (``admitted``: its cost when the provider charged it, else 0). The caller
        checked both are finite, ``limit`` > 0 and ``remaining`` within [0, limit].
        ``refusal``: read from a 429's message, the only word of a provider that
        sends no headers. Returns whether the limit changed (a new rate learned)."""
        first = self.limit is None
        if first:
            self._paced_from = now
        self._from_refusals = refusal
        self._observed_t = max(self._observed_t, now)
        changed = limit != self.limit
        if changed:
            self.limit, self.rho = limit, limit / 60.0
        if t_send >= self.remaining_t:
            self.remaining, self.remaining_t = remaining, t_send
        if admitted > 0:
            self._admitted.append((t_send, admitted))
        if t_send >= self._paced_from:
            self._obs.append((t_send, remaining))
        elif len(self._burst) < _MAX_SAMPLES:
            self._burst.append((t_send, remaining))
            self._burst_charged += admitted
        newest = max(self.remaining_t, t_send)
        # A window of readings, but at least two while the older is at most
        # ``_SPARSE`` windows old: a process that sends less often than once a window
        # (many processes on a small key) still measures its share.
        while self._obs and self._obs[0][0] < newest - self._window:
            if len(self._obs) <= 2 and self._obs[0][0] >= newest - _SPARSE * self._window:
                break
            self._obs.popleft()
        while self._admitted and self._admitted[0][0] < newest - (_SPARSE + 1) * self._window:
            self._admitted.popleft()
        self._measure()
        if first:
            self._bucket.start(now)
            self._lowest = remaining
        if not self._measured:
            self._guess(t_send, remaining, admitted)
        return changed

    def _guess(self, t_send: float, remaining: float, admitted: float) -> None:
        """The share before one is measured: what this process's requests were
        charged, over what the key spent (its limit less the lowest ``remaining``
        seen). Refreshed by each answer until a share is measured: the first
        answers to a batch arrive together, each one more of this process's own."""
        assert self.limit is not None
        self._charged += admitted
        self._lowest = min(self._lowest, remaining)
        own = max(self.sent_total, self._charged)
        if own <= 0 or self._from_refusals:
            # Nothing charged yet, or read from 429s (no headers, where
            # ``RefusalShare`` gives the share): no guess to make.
            self.share, self.share_t = 1.0, t_send
            return
        self.share = min(1.0, max(MIN_SHARE, own / max(self.limit - self._lowest, own)))
        self.share_t = t_send

    def admitted(self, t_send: float, cost: float) -> None:
        """A request sent at ``t_send`` was charged ``cost`` and its answer said
        nothing of the key (no headers): it counts in this process's share."""
        self._admitted.append((t_send, cost))
        self._charged += cost
        self.refusals.counted(t_send, cost)
        while self._admitted and self._admitted[0][0] < t_send - 2 * self._window:
            self._admitted.popleft()

    def refused(
        self, t_send: float, now: float, level: float, first: float | None, own: float
    ) -> None:
        """A quota 429 whose message named this dimension's limit (read by ``observe``)
        and ``level``, with no headers: the first starts the 429-learned share from
        what this process was charged (``own``) since its ``first`` send of the last
        minute before pacing (None: none counted); each later one cuts it
        (``RefusalShare``)."""
        assert self.limit is not None
        if self.refusals.started:
            self.refusals.throttled(now, t_send)
            return
        spent = 0.0
        if first is not None:
            spent = self.limit - level + self.rho * max(0.0, t_send - first)
        self.refusals.start(t_send, now, spent, own if first is not None else 0.0)

    def _burst_points(self, since: float) -> list[tuple[float, float]]:
        """The burst's readings a share may be measured from (see ``_measure``)."""
        if not self._burst or self._burst[-1][0] < since:
            return []
        levels = [r for _, r in self._burst]
        if max(levels) - min(levels) <= self._burst_charged:
            return []
        return [point for point in self._burst if point[0] >= since]

    def _measure(self) -> None:
        assert self.limit is not None
        if self._from_refusals:
            return  # between 429s only: RefusalShare learns the share
        # The answers to a burst sent before this process paced the key (the start of
        # a batch) are measured from only when their levels tell when the provider
        # read them. Read as it admitted each request, they are spread over the whole
        # burst of every process, wider than this process's own part of it, and each
        # counts its own sends exactly by their send times. Read when it answered
        # (the reference server does), they bunch after the whole burst, this
        # process's own sends already in each, and a share measured from one of them
        # would count those sends twice: 0.5 where 1/16 was right.
        points = sorted([*self._obs, *self._burst_points(self.remaining_t - self._window)])
        if len(points) < 2 or max(r for _, r in points) >= _FULL * self.limit:
            return
        (t1, r1), (t2, r2) = points[0], points[-1]
        spent = r1 - r2 + self.rho * (t2 - t1)
        own = sum(c for t, c in self._admitted if t1 < t <= t2)
        biggest = max((c for _, c in self._admitted), default=1.0)
        if spent > 0 and (t2 - t1 >= 0.5 or spent >= 8 * biggest):
            share = min(1.0, max(MIN_SHARE, own / spent))
            if self._measured:
                share = max(MIN_SHARE, self.share + 0.5 * (share - self.share))
            self.share, self.share_t, self._measured = share, t2, True

    def current_share(self, now: float) -> float:
        """The share paced to now: the measured one, doubled per window of silence;
        while only 429s read the key, the one they taught (``RefusalShare``)."""
        if self._from_refusals and self.refusals.started:
            return self.refusals.share(now)
        silent = now - self.share_t - self._window
        if silent <= 0:
            return self.share
        return min(1.0, self.share * math.pow(2.0, min(silent / self._window, 16.0)))

    def key_rate(self) -> float:
        """What the whole key may spend per second now (A in the module doc); its
        refill while only 429s read it (its level between them is not known)."""
        assert self.limit is not None
        if self._from_refusals:
            return self.rho
        low = self._low_fraction * self.limit
        if self.remaining >= low:
            return self.rho + (self.remaining - low) / self._drain
        return self.rho * max(0.1, 1 - SOFTNESS * (low - self.remaining) / low)

    def rate(self, now: float) -> float:
        """This process's rate: its share of the key's."""
        return self.current_share(now) * self.key_rate()

    def wait(self, now: float, cost: float) -> float:
        """Seconds until the local bucket holds ``cost`` (0: now). Unknown limit, or
        no answer for ``STALE_S``: 0."""
        if not self.paces(now):
            return 0.0
        return self._bucket.wait(now, self.rate(now), cost)

    def take(self, cost: float) -> None:
        """``cost`` leaves the local bucket (a send was granted)."""
        self.sent_total += cost
        if self.limit is not None:
            self._bucket.take(cost)

    def give_back(self, cost: float) -> None:
        """A granted send that never went out: its cost returns."""
        self.sent_total = max(0.0, self.sent_total - cost)
        if self.limit is not None:
            self._bucket.give_back(cost)

    def hold(self, until: float) -> None:
        """A 429's pause: the local bucket saves nothing up until ``until``."""
        self._bucket.hold(until)

    def least_wait(self, now: float, cost: float) -> float:
        """A lower bound of the wait for ``cost``: the whole key's bucket, refilled at
        rho since its last ``remaining``, serving it alone (a cost above the limit
        counts as the limit: the provider's "too large" answer says the rest)."""
        if self.limit is None or not self.paces(now):
            return 0.0
        level = min(self.limit, self.remaining + max(0.0, now - self.remaining_t) * self.rho)
        return max(0.0, min(cost, self.limit) - level) / self.rho
