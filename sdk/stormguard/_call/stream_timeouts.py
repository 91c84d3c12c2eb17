"""Stream timeouts: the wait for the first chunk, the gaps between chunks, a cap.

A call's ``timeout`` is the total of its attempts and backoff, and a stream read
after ``create`` returned is held to it too. That cuts a long reasoning stream
that is still sending. ``StreamTimeouts`` bounds a stream by its liveness
instead (docs/retries.md, "Streams: first chunk, idle gaps and the total"):

* ``first_chunk``: each attempt must produce its first event within this many
  seconds of being sent, or it is abandoned as an ``APITimeoutError`` that is
  retried like any failure before the hand-over (another endpoint when one can
  take it, within the retry budget and the call's total);
* ``idle``: once the stream is the caller's, each wait for more bytes may last
  this long; a longer gap ends the stream with ``APITimeoutError`` (not retried:
  the caller has part of the answer);
* ``max_duration``: no streamed call lasts longer, from its start to its end.

With ``idle`` or ``max_duration`` set, ``timeout`` bounds the call until its
stream has started; after that the stream lives as long as chunks keep coming,
up to ``max_duration``. With neither, the stream stays bounded by ``timeout``.

How: every read of a call is held to its ``Deadline`` object (the sync
connection clips each socket read to it; async readers bound each wait by it,
``_io/read_within.py``), so ``StreamBounds`` moves that one object as the call goes: to the first
chunk's bound while an attempt waits for it, back to the total for the retry
decision, then to the cap once the stream is handed over. The idle bound is
renewed before each read: sync by moving the deadline again (the wait, not the
caller's own time between reads, is what is bounded), async with a bound of its
own on the read (an async reader computes its bound before the read starts, so
the deadline itself stays at the cap).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .._core.clock import Clock
from .._core.deadline import CALL_DEADLINE_PASSED, Deadline

__all__ = ["StreamBounds", "StreamTimeouts"]

_TOTAL = "total"
_FIRST_CHUNK = "first_chunk"
_IDLE = "idle"
_MAX_DURATION = "max_duration"


def _seconds(value: object, name: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(
            f"StreamTimeouts.{name} must be a number of seconds or None, got {type(value).__name__}"
        )
    if math.isnan(value) or value <= 0:
        raise ValueError(f"StreamTimeouts.{name} must be positive, got {value!r}")
    return None if math.isinf(value) else float(value)


@dataclass(frozen=True, slots=True, kw_only=True)
class StreamTimeouts:
    """Bounds of a streamed call besides its total ``timeout`` (None: not bounded so).

    A stream that must start within 5 s on some endpoint, and may then run as long
    as no gap between chunks exceeds 30 s::

        timeouts = stormguard.StreamTimeouts(first_chunk=5, idle=30)
        client = stormguard.Client(stream_timeouts=timeouts)

    The same, with a hard stop at 30 minutes; per call, for one stream only::

        client.chat.completions.create(
            messages=messages,
            stream=True,
            stream_timeouts=stormguard.StreamTimeouts(first_chunk=5, idle=30, max_duration=1800),
        )
    """

    #: Seconds from sending an attempt to its first event; past it the attempt is a
    #: timeout, retried (another endpoint may be tried).
    first_chunk: float | None = None
    #: Seconds the stream may wait for more bytes once it is the caller's; a longer
    #: gap ends it. Set, it lets the stream outlive the call's ``timeout``.
    idle: float | None = None
    #: Seconds from the call's start to the stream's end, whatever else; set, it
    #: lets the stream outlive the call's ``timeout`` up to it.
    max_duration: float | None = None

    def __post_init__(self) -> None:
        for name in ("first_chunk", "idle", "max_duration"):
            object.__setattr__(self, name, _seconds(getattr(self, name), name))

    @property
    def outlives_timeout(self) -> bool:
        """Whether a started stream is bounded by these instead of ``timeout``."""
        return self.idle is not None or self.max_duration is not None

    @property
    def is_empty(self) -> bool:
        return self.first_chunk is None and not self.outlives_timeout


class StreamBounds:
    """The bounds of one streamed call, phase by phase, held in its ``Deadline``
    (module doc). Used by the call (``_call/pipeline.py``) and its stream
    (``_call/streaming.py``), from one thread or task at a time."""

    __slots__ = (
        "_cap",
        "_clock",
        "_deadline",
        "_fired",
        "_kind",
        "_read_started",
        "_streaming",
        "_total_at",
        "_total_kind",
        "timeouts",
    )

    def __init__(self, timeouts: StreamTimeouts, deadline: Deadline, clock: Clock) -> None:
        self.timeouts = timeouts
        self._deadline = deadline
        self._clock = clock
        self._kind = _TOTAL
        cap = timeouts.max_duration
        self._cap = math.inf if cap is None else clock.now() + cap
        if self._cap < deadline.at:  # a cap sooner than the total bounds the start too
            self._hold(self._cap, _MAX_DURATION)
        #: The bound of the call before its stream starts: the total (or the cap).
        self._total_at = deadline.at
        self._total_kind = self._kind
        self._streaming = False
        self._read_started: float | None = None
        #: What a bound that was not the deadline's said when it passed (async idle).
        self._fired: str | None = None

    @classmethod
    def of(
        cls, timeouts: StreamTimeouts | None, deadline: Deadline, clock: Clock
    ) -> StreamBounds | None:
        """Bounds for a streamed call (None: nothing beyond its deadline)."""
        if timeouts is None or timeouts.is_empty:
            return None
        return cls(timeouts, deadline, clock)

    def _text(self, kind: str) -> str:
        timeouts = self.timeouts
        if kind == _FIRST_CHUNK:
            return (
                "the stream's first-chunk timeout passed"
                f" (no first chunk within {timeouts.first_chunk:g} s)"
            )
        if kind == _IDLE:
            return f"the stream's idle timeout passed (no chunk for {timeouts.idle:g} s)"
        if kind == _MAX_DURATION and timeouts.max_duration is not None:
            return (
                "the stream's max_duration passed"
                f" ({timeouts.max_duration:g} s since the call began)"
            )
        return CALL_DEADLINE_PASSED

    def _hold(self, at: float, kind: str) -> None:
        self._kind = kind
        self._deadline.hold_to(at, self._text(kind))

    # -- before the first chunk: each attempt -----------------------------------------

    def deadline_header(self, remaining: float) -> float:
        """The seconds an attempt announces in ``x-request-deadline-ms``: ``remaining``
        of the call, or, for a stream that may outlive it, the time to its cap
        (``inf``: none, no header), so the server does not abort it at the total."""
        if not self.timeouts.outlives_timeout:
            return remaining
        return max(self._cap - self._clock.now(), 0.0)

    def attempt_timeout(self, timeout: dict[str, float | None]) -> dict[str, float | None]:
        """An attempt's timeouts (the ``timeout`` request extension): a stream that
        may outlive the call's timeout reads for as long as an idle gap, or to its
        cap (connect, write and pool keep their bounds)."""
        if not self.timeouts.outlives_timeout:
            return timeout
        idle, read = self.timeouts.idle, math.inf
        given = timeout["read"]
        if idle is not None and given is not None:
            read = max(given, idle)
        read = min(read, self._cap - self._clock.now())
        return {**timeout, "read": read if math.isfinite(read) else None}

    def attempt_started(self) -> None:
        """An attempt is being sent: its first chunk must come within ``first_chunk``."""
        first = self.timeouts.first_chunk
        if first is None or self._streaming:
            return
        at = self._clock.now() + first
        if at < self._total_at:
            self._hold(at, _FIRST_CHUNK)

    def attempt_over(self) -> None:
        """The attempt failed before its first chunk: the call's own bound is back,
        for the retry decision and the next attempt."""
        if not self._streaming and self._kind == _FIRST_CHUNK:
            self._hold(self._total_at, self._total_kind)

    @property
    def first_chunk_passed(self) -> bool:
        """Whether an attempt's first-chunk bound is what passed: its timeout is
        retried like any failure before the hand-over."""
        return not self._streaming and self._kind == _FIRST_CHUNK and self._deadline.expired

    # -- after the first chunk: the caller's stream -----------------------------------

    def handed_over(self) -> None:
        """The first chunk is the caller's: with ``idle`` or ``max_duration`` the
        stream is bounded by them from now on, else still by the call's total."""
        self._streaming = True
        if self.timeouts.outlives_timeout:
            self._hold(self._cap, _MAX_DURATION)  # inf without a cap: the gaps only
        elif self._kind == _FIRST_CHUNK:
            self._hold(self._total_at, self._total_kind)

    def before_read(self, *, clip: bool) -> float | None:
        """Before each wait for more of the stream: with ``idle``, the wait may last
        that long. ``clip`` (sync): the deadline moves to the wait's end, where the
        connection cuts its reads; else the seconds are returned, for the async
        reader's bound (None: no idle bound, or the cap comes first)."""
        idle = self.timeouts.idle
        if not self._streaming or idle is None:
            return None
        now = self._clock.now()
        self._read_started = now
        if now + idle >= self._cap:
            if self._kind != _MAX_DURATION:
                self._hold(self._cap, _MAX_DURATION)
            return None
        if clip:
            self._hold(now + idle, _IDLE)
            return None
        return idle

    def after_read(self) -> bool:
        """Whether the wait that just ended outlasted ``idle`` (a read that returned
        at the edge, or time a test's clock moved): the stream ends as if cut then."""
        started, idle = self._read_started, self.timeouts.idle
        self._read_started = None
        if started is None or idle is None or self._clock.now() - started <= idle:
            return False
        self.idle_passed()
        return True

    def read_timed_out(self) -> None:
        """The transport's read timeout ended a wait for more of the stream. With an
        idle bound that read timeout is the idle gap or longer (``attempt_timeout``
        reads for ``max(read, idle)``), so the gap passed: the stream ends by its idle
        bound, whichever of the two timers (the transport's, from its last bytes, or
        the async reader's, from the read) fired first. The cap, when it came
        first, speaks for itself (``timeout_reason``)."""
        if (
            self._streaming
            and self._read_started is not None
            and self.timeouts.idle is not None
            and self._clock.now() < self._cap
        ):
            self.idle_passed()

    def idle_passed(self) -> str:
        """Note that an idle gap ended the stream; what its error says."""
        self._fired = self._text(_IDLE)
        return self._fired

    def timeout_reason(self) -> str | None:
        """What the stream bound that passed says (None: none did, or the call's own
        deadline is what passed: its errors say so as without stream timeouts)."""
        if self._fired is not None:
            return self._fired
        if self._kind != _TOTAL and self._deadline.expired:
            return self._deadline.passed
        return None
