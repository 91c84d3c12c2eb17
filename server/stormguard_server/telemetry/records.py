"""The life of one generation request, as a record that observers read.

The generation flow fills a ``RequestRecord`` as the request moves (queued,
admitted or shed, first token, end) and hands it to every observer twice: when
it arrives and when it is over. Metrics are one observer (metrics.py); the
timestamps are all a tracer needs to emit the admission-wait, prefill and
decode spans after the fact, and all a benchmark needs to count attempts,
sheds and tokens generated for callers that had gone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

from stormguard.protocol import Priority, ShedReason

Outcome = Literal["ok", "shed", "client_gone", "deadline_exceeded", "engine_error"]
GoneStage = Literal["queued", "running"]


@dataclass
class RequestRecord:
    """What happened to one request; times are seconds on the server's clock (``clock.py``)."""

    request_id: str
    kind: str
    model: str
    priority: Priority
    attempt: int | None
    deadline_ms: float | None
    prompt_tokens: int
    max_tokens: int
    arrival: float
    # Admission (None when admission is off or the request never got that far).
    cost: int | None = None
    queue_position: int | None = None
    admitted_at: float | None = None
    shed_reason: ShedReason | None = None
    # Engine.
    started: bool = False
    first_token_at: float | None = None
    finished_at: float | None = None
    finish_reason: str | None = None
    output_tokens: int = 0
    # End.
    outcome: Outcome | None = None
    gone_stage: GoneStage | None = None
    error: str | None = None

    @property
    def queue_wait_s(self) -> float | None:
        return None if self.admitted_at is None else self.admitted_at - self.arrival

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_at is None else self.first_token_at - self.arrival

    @property
    def latency_s(self) -> float | None:
        return None if self.finished_at is None else self.finished_at - self.arrival


class RequestObserver(Protocol):
    """Receives every request's record when it arrives and when it is over."""

    def request_arrived(self, record: RequestRecord) -> None: ...

    def request_done(self, record: RequestRecord) -> None: ...
