"""A slot of an endpoint's concurrency limit, held by one attempt: a ``Lease``.

The attempt marks how it went (``mark``) and gives the slot back once
(``release``); the endpoint's limit (``_policies/limiter/endpoint_limit.py``) adapts to the
outcome then. A lease knows that limit only as a ``SlotOwner``: the endpoint's
module builds on this one, not the other way round.
"""

from __future__ import annotations

from typing import Protocol

from ..._core.verdict import LimitOutcome
from ...protocol import ServerLoad

__all__ = ["Lease", "SlotOwner"]


class SlotOwner(Protocol):
    """What a lease needs of the limit that granted it (``EndpointLimit``)."""

    @property
    def name(self) -> str:
        """The endpoint's name."""
        ...

    @property
    def limit(self) -> int:
        """The limit now."""
        ...

    def release(self, lease: Lease) -> None:
        """Take the slot back, and learn from the outcome marked on it."""
        ...


class Lease:
    """One slot of an endpoint's limit, held by one attempt; released exactly once."""

    __slots__ = (
        "_limit",
        "epoch",
        "granted_at",
        "in_flight_at_start",
        "load",
        "outcome",
        "queued_s",
        "released",
        "ttft",
    )

    def __init__(
        self, limit: SlotOwner, epoch: int, in_flight: int, queued_s: float, granted_at: float
    ) -> None:
        self._limit = limit
        self.epoch = epoch
        self.granted_at = granted_at
        self.in_flight_at_start = in_flight
        #: Seconds the call waited in the local queue for this slot.
        self.queued_s = queued_s
        self.outcome = LimitOutcome.IGNORED
        self.load: ServerLoad | None = None
        #: A stream's time to first token (None for other calls).
        self.ttft: float | None = None
        self.released = False

    @property
    def endpoint(self) -> str:
        return self._limit.name

    @property
    def limit(self) -> int:
        """The endpoint's limit when this slot was granted."""
        return self._limit.limit

    def mark(
        self, outcome: LimitOutcome, load: ServerLoad | None = None, ttft: float | None = None
    ) -> None:
        """Record how the attempt went; the slot is freed later (a stream holds it to its end)."""
        self.outcome = outcome
        self.load = load
        self.ttft = ttft

    def release(self) -> None:
        """Free the slot with the outcome marked (IGNORED when none was)."""
        if not self.released:
            self.released = True
            self._limit.release(self)

    def __repr__(self) -> str:
        return f"Lease({self.endpoint!r}, outcome={self.outcome.value})"
