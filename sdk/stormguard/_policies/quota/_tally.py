"""``SendTally``: what this process's answered calls to one key were charged before
the key's pacing turned on, over the last minute.

A provider that sends no ``x-ratelimit-*`` headers says nothing of the key until
its first 429; by then this process has sent for a while at its own pace, and
what it was charged of what the key spent is its part of the key
(``RefusalShare``). A minute is kept, the span of the key's bucket: older sends
say nothing of it. Thirteen slots of five seconds: the same few numbers however
many calls go by. Thread-safe.
"""

from __future__ import annotations

import math

from ..._core.fork import fork_safe_lock

__all__ = ["SendTally", "TallyReading"]

#: Seconds of sends kept (a key's bucket refills in a minute).
SPAN_S = 60.0
_SLOT_S = 5.0
#: Slots kept: every one a minute before now meets, the oldest partly.
_SLOTS = int(SPAN_S / _SLOT_S) + 1
#: The slot number of a slot nothing was counted in.
_EMPTY = -(2**62)


class TallyReading(tuple[float, float, float]):
    """``(first, tokens, requests)``: the first send counted and what the sends since
    were charged."""

    __slots__ = ()

    @property
    def first(self) -> float:
        return self[0]

    @property
    def tokens(self) -> float:
        return self[1]

    @property
    def requests(self) -> float:
        return self[2]


class SendTally:
    """This process's charged sends to one key, per five seconds, for a minute."""

    __slots__ = ("_first", "_lock", "_requests", "_slot", "_tokens")

    def __init__(self) -> None:
        self._lock = fork_safe_lock()
        self._slot = [_EMPTY] * _SLOTS
        self._tokens = [0.0] * _SLOTS
        self._requests = [0.0] * _SLOTS
        self._first = math.inf

    def add(self, t_send: float, tokens: float) -> None:
        """A call sent at ``t_send`` was answered and charged ``tokens`` (and one
        request)."""
        slot = math.floor(t_send / _SLOT_S)
        index = slot % _SLOTS
        with self._lock:
            if self._slot[index] != slot:
                if self._slot[index] > slot:
                    return  # older than the minute kept
                self._slot[index], self._tokens[index], self._requests[index] = slot, 0.0, 0.0
            self._tokens[index] += tokens
            self._requests[index] += 1.0
            self._first = min(self._first, t_send)

    def reading(self, now: float) -> TallyReading | None:
        """What the sends of the last minute before ``now`` were charged, and the first
        of them (None: none)."""
        oldest = math.floor((now - SPAN_S) / _SLOT_S)
        with self._lock:
            live = [i for i in range(_SLOTS) if self._slot[i] >= oldest]
            if not live:
                return None
            first = max(self._first, min(self._slot[i] for i in live) * _SLOT_S)
            tokens = sum(self._tokens[i] for i in live)
            requests = sum(self._requests[i] for i in live)
        return TallyReading((first, tokens, requests))
