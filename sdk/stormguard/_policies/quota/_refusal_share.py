"""``RefusalShare``: the share of a key's refill one process paces to when the
provider sends no ``x-ratelimit-*`` headers and only its 429s' messages ("Limit L,
Used U") read the key.

Between 429s nothing says what the key holds or how many processes spend it, so
the share cannot be measured as ``ShareController`` measures it from headers (its
readings at the 429s alone gave shares that swung 0.15-0.34 for 4 equal
processes, and paced them into a 429 every second or two). Instead:

* **The first 429 starts it from what this process sent.** Before its pacing
  turned on, every process on a batch sent as fast as it could; what this one was
  charged (``SendTally``, from its answers, and the answers still in flight when
  the 429 came) over what the key spent since this process's first send (its
  limit less the level the 429 names, plus its refill meanwhile) is its part of
  the key: ~0.25 each for 4 processes. The first 429 is a cut from it, as every
  429 is; a 429 for a request sent before the first one came back is the same
  news and cuts nothing.
* **Each 429 after is a cut**, as AWS's adaptive mode and TCP's CUBIC make one:
  the share drops to ``BETA`` times what it was and grows back along a cubic,
  flat near it, to it in ``RECOVER_S``; past it the cubic grows it again (by
  itself, and by ``GROWTH`` of the whole key, the same for every process, so the
  one that was cut most catches up), so a process whose peers finished finds
  the room they left.

The process then sends at its share times the key's refill. Scale-free: a
share of the refill, whether the key counts tokens or requests. Chosen in
simulation (``tests/sdk/policies/quota/quota_sim.py``, docs/quotas.md): with 4 processes,
12 429s in 300 calls on average (39 before), at 1.07 x the least wall time.
No lock: ``KeyQuota`` holds its key's.
"""

from __future__ import annotations

import math

__all__ = ["BETA", "GROWTH", "RECOVER_S", "RefusalShare"]

#: The drop on a 429 (AWS's and TCP CUBIC's 0.7 cut 12 % more 429s in simulation).
BETA = 0.8
#: Seconds from a 429 back to the share it came at (8 s: 60 % more 429s; 16 s: slower).
RECOVER_S = 12.0
#: The share of the whole key a process gains past its old share, times the cubic.
GROWTH = 0.02
#: The least share: 256 processes on one key.
MIN_SHARE = 1 / 256
# From any share the growth is back to the whole key within ``STALE_S`` (60 s) of a
# 429 (in 56 s from ``MIN_SHARE``), when the dimension stops pacing on that 429: a
# slower growth would let every waiting call go at once then, a first wave of 429s
# each minute (seen in simulation with a slower one).


class RefusalShare:
    """One dimension's share of the key's refill, learned from 429s (module doc)."""

    __slots__ = ("_cut_since", "_first", "_own", "_spent", "fair", "started", "t_cut", "w_max")

    def __init__(self) -> None:
        #: Whether the first 429 has set the share.
        self.started = False
        #: The share before the last cut, and when the cut came.
        self.w_max = 1.0
        self.t_cut = -math.inf
        #: What this process sent of the key's spend before its first 429 (1.0:
        #: nothing counted).
        self.fair = 1.0
        #: The first 429's send time, and what the key and this process spent before.
        self._first = -math.inf
        self._spent = 0.0
        self._own = 0.0
        #: Whether a 429 after the first has cut the share (then what this process
        #: sent before no longer sets it).
        self._cut_since = False

    def start(self, t_send: float, now: float, spent: float, own: float) -> None:
        """The first 429, for a request sent at ``t_send``: the key had spent ``spent``
        since this process's first send, ``own`` of it this process's (0: not
        counted, so the share starts whole and the next 429s find it)."""
        self.started = True
        self._first, self._spent, self._own = t_send, spent, own
        self._cut_since = False
        self.fair = self._part()
        self.w_max, self.t_cut = self.fair, now

    def counted(self, t_send: float, cost: float) -> None:
        """An answer to a request sent before the first 429: it was part of the spend
        the first 429 found, so this process's part grows (until a later cut)."""
        if not self.started or t_send >= self._first or self._own <= 0:
            return
        self._own += cost
        self.fair = self._part()
        if not self._cut_since:
            self.w_max = self.fair

    def throttled(self, now: float, t_send: float) -> None:
        """A later 429 for the request sent at ``t_send``: a cut, unless it was sent
        before the last cut (the same news)."""
        if t_send < self.t_cut:
            return
        self.w_max, self.t_cut, self._cut_since = self.share(now), now, True

    def share(self, now: float) -> float:
        """The share to pace to now."""
        x = (now - self.t_cut) / RECOVER_S - 1.0
        if x <= 0:
            share = self.w_max * (1.0 - (1.0 - BETA) * (-x) ** 3)
        else:
            grown = min(x, 8.0) ** 3
            share = self.w_max * (1.0 + (1.0 - BETA) * grown) + GROWTH * grown
        return max(MIN_SHARE, min(1.0, share))

    def _part(self) -> float:
        if self._own <= 0 or self._spent <= 0:
            return 1.0
        return max(MIN_SHARE, min(1.0, self._own / self._spent))
