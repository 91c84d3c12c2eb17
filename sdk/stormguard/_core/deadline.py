"""The total time budget of one logical call: every attempt and every sleep.

A driver makes the call's deadline the *current* one around the I/O it does
(``with deadline.bound():``); the network backend under the sync transport
(``_io/deadline_backend.py``, under ``_io/deadline_transport.py``) reads it there
and clips every socket operation to it, so the deadline reaches
code the call does not run itself (httpx, httpcore) without being passed down.

A stream's bounds (``_call/stream_timeouts.py``) move that one object with
``hold_to``: the first-chunk timeout of an attempt, then each idle gap, so the
connection that holds it clips its next read to the new bound.
"""

from __future__ import annotations

import math
from contextvars import ContextVar, Token
from types import TracebackType

from .clock import Clock

__all__ = ["CALL_DEADLINE_PASSED", "Deadline", "current_deadline"]

# An attempt given less than this is not worth sending: no LLM server answers a
# request in under 1 ms, so sending it would only add load.
MIN_ATTEMPT_TIME = 0.001

#: What an error says when a call's own deadline is what passed.
CALL_DEADLINE_PASSED = "the call's deadline passed"

_current: ContextVar[Deadline | None] = ContextVar("stormguard_deadline", default=None)


def current_deadline() -> Deadline | None:
    """The deadline of the I/O running in this thread or task (None: unbounded)."""
    return _current.get()


class Deadline:
    """A point on the clock after which the caller no longer wants an answer."""

    __slots__ = ("_clock", "at", "passed", "timeout")

    def __init__(self, clock: Clock, timeout: float | None) -> None:
        if timeout is not None and (math.isnan(timeout) or timeout <= 0):
            raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
        self._clock = clock
        self.timeout = timeout
        self.at = math.inf if timeout is None else clock.now() + timeout
        #: What an error says when this deadline passes (a stream's bound says which).
        self.passed = CALL_DEADLINE_PASSED

    def remaining(self) -> float:
        """Seconds left (``inf`` without a timeout, never negative)."""
        return max(self.at - self._clock.now(), 0.0)

    @property
    def expired(self) -> bool:
        return self.remaining() < MIN_ATTEMPT_TIME

    def allows_sleep(self, seconds: float) -> bool:
        """Whether sleeping ``seconds`` still leaves time for an attempt afterwards."""
        return self.remaining() - seconds >= MIN_ATTEMPT_TIME

    def within(self, seconds: float | None) -> Deadline:
        """The sooner of this deadline and ``seconds`` from now (a lookup's own limit)."""
        if seconds is None or seconds >= self.remaining():
            return self
        bounded = Deadline.__new__(Deadline)
        bounded._clock = self._clock
        bounded.timeout = seconds
        bounded.at = self._clock.now() + max(seconds, 0.0)
        bounded.passed = self.passed
        return bounded

    def hold_to(self, at: float, passed: str) -> None:
        """Move this deadline to ``at`` (``inf``: none), saying ``passed`` when it
        passes: a stream's bounds do (module doc). I/O that holds this object
        sees the new bound at its next operation."""
        self.at = at
        self.passed = passed
        self.timeout = None if math.isinf(at) else max(at - self._clock.now(), 0.0)

    def bound(self) -> _Bound:
        """Make this the current deadline for the ``with`` block (see the module doc)."""
        return _Bound(self)


class _Bound:
    """``with deadline.bound():`` — a plain class, cheaper than ``contextlib``'s."""

    __slots__ = ("_deadline", "_token")

    def __init__(self, deadline: Deadline) -> None:
        self._deadline = deadline
        self._token: Token[Deadline | None] | None = None

    def __enter__(self) -> None:
        self._token = _current.set(self._deadline)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._token is not None:
            _current.reset(self._token)
            self._token = None
