"""An endpoint's place in rotation: its status, the live record behind it, a
change of it as listeners see it, and a frozen copy for ``client.stats()``.

The record is live state (``_Record``, one per ``EndpointState``, changed only
under the ``EjectionTracker``'s lock); ``EjectionTransition`` and
``EndpointHealth`` are frozen, safe to hand to any thread.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..._core.sliding_window import SlidingWindowCounts

__all__ = ["EjectionListener", "EjectionTransition", "EndpointHealth", "EndpointStatus"]


class EndpointStatus(str, enum.Enum):
    """Whether calls may go to an endpoint."""

    #: In rotation.
    ACTIVE = "active"
    #: Out of rotation until its ejection ends (or, unreachable, a connect check passes).
    EJECTED = "ejected"
    #: Back in rotation on trial: a failure before ``probation_successes`` ejects it again.
    PROBATION = "probation"


@dataclass(frozen=True, slots=True)
class EjectionTransition:
    """One change of an endpoint's status, as listeners and telemetry see it.

    ``reason``: ``unreachable``, ``consecutive_failures``, ``success_rate``,
    ``probation_failed`` (to ejected), ``probe_failed`` (a connect check failed: still
    ejected, for longer), ``reachable`` or ``ejection_time_elapsed`` (to probation),
    ``probation_passed`` (to active).
    """

    endpoint: str
    from_status: EndpointStatus
    to_status: EndpointStatus
    reason: str
    #: Clock time of the change (``Clock.now()``, monotonic seconds).
    at: float
    #: Seconds until the ejection ends or the next connect check; None unless ejected.
    ejected_for: float | None = None


EjectionListener = Callable[[EjectionTransition], None]


@dataclass(frozen=True, slots=True)
class EndpointHealth:
    """One endpoint's ejection state at an instant, for ``client.stats()``."""

    endpoint: str
    status: EndpointStatus
    #: Why it was last ejected (None if never).
    reason: str | None
    #: Seconds until the ejection ends or the next connect check; None unless ejected.
    ejected_for: float | None
    #: Times it has been ejected since the client was made.
    ejections: int
    consecutive_failures: int
    #: Successes and failures over the success-rate window.
    successes: int
    failures: int


class _Record:
    """What the tracker knows of one endpoint (under the tracker's lock)."""

    __slots__ = (
        "backoff",
        "consecutive",
        "ejections",
        "multiplier",
        "probation_left",
        "probing",
        "reason",
        "returned_at",
        "status",
        "until",
        "window",
    )

    def __init__(self, window: SlidingWindowCounts) -> None:
        self.status = EndpointStatus.ACTIVE
        self.reason: str | None = None
        self.until = -math.inf
        self.window = window  # (successes, failures)
        self.consecutive = 0
        self.ejections = 0
        #: Envoy's ejection time multiplier (times ejected, falling while in rotation).
        self.multiplier = 0
        self.returned_at = -math.inf
        #: The current connect backoff (0: not unreachable since the last success).
        self.backoff = 0.0
        self.probing = False
        self.probation_left = 0
