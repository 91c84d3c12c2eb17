"""What passes between the admission controller and the front ends: a request
asking for admission (``Ticket``), the yes (``Grant``), the no (``Shed``, raised
as ``ShedError``). Values only: the controller (``controller.py``) decides."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from stormguard.protocol import Priority, ShedReason


@dataclass(frozen=True, slots=True)
class Shed:
    """A refusal: the reason, when to come back, and whether coming back can help."""

    reason: ShedReason
    retry_after_s: float | None
    should_retry: bool
    message: str

    @property
    def status_code(self) -> int:
        """400 for what can never fit, 503 for overload and unreadiness."""
        return 400 if self.reason is ShedReason.TOO_LONG else 503


class ShedError(Exception):
    """Raised by ``acquire`` when a request is refused, now or while it waited."""

    def __init__(self, shed: Shed) -> None:
        super().__init__(shed.message)
        self.shed = shed


@dataclass(eq=False)
class Ticket:
    """One request asking for admission (identity is the object)."""

    cost: int
    priority: Priority = Priority.STANDARD
    attempt: int = 1
    # Tokens it may generate (part of the cost), when the front end knows them: the
    # wait estimate tells prefill from decoding with it.
    max_tokens: int | None = None
    # Absolute time (controller clock) after which the caller no longer waits.
    deadline: float | None = None
    arrival: float = 0.0
    seq: int = 0
    admitted_at: float | None = None
    # True from admission until release: its cost counts as in flight.
    inflight: bool = False
    # Place in the queue when it was queued (0 = next); None when admitted at once.
    queue_position: int | None = None
    future: asyncio.Future[None] | None = field(default=None, repr=False)

    @property
    def is_retry(self) -> bool:
        return self.attempt > 1

    @property
    def shape(self) -> tuple[int, int]:
        """(prompt tokens, max_tokens) as far as known: the whole cost is taken for the
        prompt when max_tokens is not."""
        output = self.max_tokens or 0
        return max(0, self.cost - output), output

    @property
    def order_key(self) -> tuple[int, int]:
        """Serving order: priority, then arrival."""
        return (self.priority.rank, self.seq)

    @property
    def shed_key(self) -> tuple[int, bool, int]:
        """Shedding order (largest goes first): least important, retries, newest."""
        return (self.priority.rank, self.is_retry, self.seq)


@dataclass(frozen=True, slots=True)
class Grant:
    """Admission granted to a request; release it (``AdmissionController.release``)
    when the engine is done. ``waited_s`` and ``ticket.queue_position`` describe its wait
    (what a tracing span of the admission step records)."""

    ticket: Ticket
    waited_s: float
