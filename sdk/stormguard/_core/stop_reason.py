"""Why a call's retry loop stopped: ``StormguardError.retry_stopped_by``.

A ``StrEnum`` (a ``str`` subclass on Python 3.10 too), so a member is equal to
its value (``err.retry_stopped_by == "budget"``) and telemetry records the plain
string. docs/retries.md lists the same members; a test holds the two together.
"""

from __future__ import annotations

import enum
import sys

__all__ = ["StopReason"]

if sys.version_info >= (3, 11):
    _StrEnum = enum.StrEnum
else:  # pragma: no cover - exercised on 3.10 only

    class _StrEnum(str, enum.Enum):
        """3.11's ``enum.StrEnum``: ``str()`` and ``format()`` give the value."""

        __str__ = str.__str__
        __format__ = str.__format__  # type: ignore[assignment]


class StopReason(_StrEnum):
    """Why no further attempt was made after a failed one.

    >>> StopReason.BUDGET == "budget"
    True
    >>> StopReason("deadline") is StopReason.DEADLINE
    True
    """

    #: The retry policy's ``max_attempts`` were used (requeued sheds do not count).
    MAX_ATTEMPTS = "max_attempts"
    #: The retry budget refused the retry: retries are already a large share of calls.
    BUDGET = "budget"
    #: The wait before the next attempt would end past the call's deadline, or no
    #: concurrency slot came free in time (``QueueTimeoutError``).
    DEADLINE = "deadline"
    #: No endpoint can take the call: every breaker open or endpoint ejected
    #: (``CircuitOpenError``, or none accepting the retry or requeue).
    CIRCUIT_OPEN = "circuit_open"
    #: Adaptive throttling refused the attempt in this process (``ThrottledError``).
    THROTTLED = "throttled"
    #: Too many calls already wait for a concurrency slot (``LocalQueueFullError``).
    QUEUE_FULL = "queue_full"
    #: The server answered ``x-should-retry: false`` (too long, a shed retry).
    SHOULD_RETRY_FALSE = "should_retry_false"
    #: The failure is not worth another attempt: a caller error, an account out of
    #: quota, a timeout or a cut after the answer began, a malformed body.
    NOT_RETRYABLE = "not_retryable"
    #: The caller cancelled the call (task cancelled, ``KeyboardInterrupt``).
    CANCELLED = "cancelled"
    #: A shed could not be requeued (the limiter's requeue budget was spent) and
    #: the retry policy does not retry its status.
    REQUEUE_BUDGET = "requeue_budget"
