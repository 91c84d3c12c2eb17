"""The states a circuit breaker is in, and the records of them it hands out.

``CircuitState`` is where a breaker is; a ``BreakerTransition`` goes to the
listeners at each change (telemetry, the user's hooks); a ``BreakerSnapshot`` is
a frozen copy taken on request (``client.stats()``, tests). No behaviour here:
the breaker that makes them is ``_policies/breaker/circuit.py``.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["BreakerListener", "BreakerSnapshot", "BreakerTransition", "CircuitState"]


class CircuitState(str, enum.Enum):
    """Where a breaker is: calls flow, calls fail fast, or a few probes test the server."""

    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


@dataclass(frozen=True, slots=True)
class BreakerTransition:
    """One state change, as the telemetry sees it.

    ``reason`` is one of ``failure_rate``, ``slow_call_rate``, ``consecutive_failures``
    (closed → open), ``open_time_elapsed`` (open → half_open), ``probe_failed``,
    ``probe_slow`` (half_open → open), ``probes_succeeded`` (half_open → closed).
    """

    name: str
    from_state: CircuitState
    to_state: CircuitState
    reason: str
    #: Clock time of the change (``Clock.now()``, monotonic seconds).
    at: float
    #: Seconds the breaker stays open; None unless ``to_state`` is open.
    open_for: float | None = None


BreakerListener = Callable[[BreakerTransition], None]


@dataclass(frozen=True, slots=True)
class BreakerSnapshot:
    """A frozen copy of a breaker at one instant, for ``client.stats()`` and tests."""

    name: str
    state: CircuitState
    #: Outcomes in the window, and how many of them failed or were slow.
    calls: int
    failures: int
    slow_calls: int
    failure_rate: float
    slow_call_rate: float
    consecutive_failures: int
    #: Seconds until an open breaker lets probes through; None when not open.
    retry_in: float | None
    probes_in_flight: int
    #: Times the breaker has opened since it was created.
    trips: int
