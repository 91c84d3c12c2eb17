"""What a logical call tells the outside world: events and the observer interface.

A logical call (``_call/pipeline.py`` and the modules of its state, most events
from ``_call/call_events.py``) knows nothing of OpenTelemetry: at each decision it
hands a frozen event to the call's observer, when there is one.
``stormguard.telemetry.Telemetry`` is the observer that turns these events into
spans and metrics; any object with the same methods can take its place
(``Client(telemetry=MyObserver())``), and ``telemetry=None`` turns the events
off altogether, so a call then builds no event at all.

One ``Observer`` per client; it hands out one ``CallObserver`` per logical call
(or None: nothing to record, the cheapest answer). Events arrive in this order::

    CallStarted → [PrecheckPassed] → (AttemptStarted → AttemptEnded | BudgetRefused)*
      → [FellBack → (AttemptStarted → AttemptEnded)* ...] → [FirstChunk] → CallEnded

``AttemptEnded`` of a stream's successful attempt comes at its first chunk; the
stream goes on until ``CallEnded`` (end of stream, error, or closed early).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from .._core.stop_reason import StopReason
    from .._policies.breaker.states import BreakerTransition
    from .._policies.retry.budget import BudgetSnapshot
    from .._policies.routing.ejection_status import EjectionTransition
    from ..protocol import ServerLoad

__all__ = [
    "AttemptEnded",
    "AttemptStarted",
    "BudgetRefused",
    "CallEnded",
    "CallEvent",
    "CallObserver",
    "CallStarted",
    "FellBack",
    "FirstChunk",
    "Observer",
    "PrecheckPassed",
    "ResponseSummary",
]


def _as_is(text: str) -> str:
    return text


@dataclass(frozen=True, slots=True)
class CallStarted:
    """A logical call begins (before its token pre-check)."""

    #: ``chat``, ``text_completion``, ``models`` or ``http`` (transport mode, other routes).
    operation: str
    model: str | None
    stream: bool
    max_tokens: int | None
    #: Host and port of the client's first endpoint (the one a single-server client uses).
    server_address: str | None
    server_port: int | None
    #: The request body; an observer copies message text from it only when asked to.
    body: Mapping[str, Any] | None
    #: The call's scrubber: an observer passes every text that came from the server
    #: (and any error's message) through it before recording it, so that an API key
    #: the server echoed back is recorded as ``[redacted]``.
    scrub: Callable[[str], str] = _as_is


@dataclass(frozen=True, slots=True)
class PrecheckPassed:
    """The token pre-check found the request fits (or could not know the window)."""

    model: str
    prompt_tokens: int
    max_tokens: int
    context_window: int | None
    counter: str
    #: Seconds the token rate limiter makes the call wait before its first attempt.
    rate_limit_wait: float


@dataclass(frozen=True, slots=True)
class AttemptStarted:
    """One HTTP attempt is about to be sent."""

    #: 1 for the first attempt on the current model, 2 for its first retry, ...
    number: int
    model: str | None
    method: str
    url: str
    endpoint: str
    #: Seconds slept before this attempt (backoff or Retry-After; 0 for the first).
    backoff: float
    #: ``model@endpoint`` of the breaker that let it through, and that breaker's state.
    breaker: str | None
    breaker_state: str | None
    #: Seconds waited in the local queue for a concurrency slot before this attempt.
    queued: float = 0.0
    #: The endpoint's concurrency limit when the slot was granted (None: no limiter).
    concurrency_limit: int | None = None
    #: A retry that went to an endpoint the call had not tried, outside the retry budget.
    failover: bool = False
    #: Seconds waited for the share of the key's quota before this attempt, and what
    #: the key's pacer knew then: this process's share of the key, what the key had
    #: left (None: the key is not paced, or the provider did not say).
    quota_wait: float = 0.0
    quota_share: float | None = None
    quota_remaining_tokens: float | None = None
    quota_remaining_requests: float | None = None
    #: The ``Deployment`` it goes to and that deployment's tier (None: a plain endpoint).
    deployment: str | None = None
    tier: int | None = None
    #: ``"hit"``: it goes to its prefix-cache affinity key's home; ``"overflow"``: to
    #: another endpoint (the home full, shedding or tried); None: no key.
    affinity: str | None = None
    #: It is a hedge: one more attempt of a slow call, to another endpoint.
    hedge: bool = False


@dataclass(frozen=True, slots=True)
class AttemptEnded:
    """An attempt is over as far as retries go.

    ``outcome``: ``ok``, ``retry`` (another attempt follows), ``failover`` (another
    attempt follows, on an endpoint the call has not tried), ``requeued`` (shed
    before processing: back to the local queue) or the ``StopReason`` the retry
    loop stopped here with (``max_attempts``, ``budget``, ``deadline``, ...).
    """

    outcome: str
    status_code: int | None
    #: Exception class name of a failed attempt.
    error_type: str | None
    #: The load headers of the attempt's response (empty when it got none).
    server_load: ServerLoad
    duration: float


@dataclass(frozen=True, slots=True)
class BudgetRefused:
    """The retry budget refused a retry; the call stops here."""

    budget: BudgetSnapshot


@dataclass(frozen=True, slots=True)
class FellBack:
    """The call moves on to a fallback model."""

    from_model: str | None
    to_model: str
    #: Exception class name of the failure that caused it.
    reason: str
    #: Why it moved (``FallbackKind``): ``"unavailable"``, ``"context_window"`` or
    #: ``"content_policy"``.
    kind: str = "unavailable"


@dataclass(frozen=True, slots=True)
class FirstChunk:
    """A stream's first chunk is in the caller's hands."""

    response_id: str | None
    response_model: str | None


@dataclass(frozen=True, slots=True)
class ResponseSummary:
    """What the answer said about itself (from the body, or a stream's chunks)."""

    response_id: str | None = None
    response_model: str | None = None
    finish_reasons: tuple[str, ...] = ()
    input_tokens: int | None = None
    output_tokens: int | None = None
    #: The generated text, one entry per choice (empty unless it was collected).
    output_text: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class CallEnded:
    """The logical call is over: a result, a final error, or the caller left."""

    #: The final error; None on success or when the caller cancelled or closed early.
    error: BaseException | None
    #: True when the caller stopped the call (task cancelled, stream closed early).
    cancelled: bool
    #: The model that served (or last tried); differs from the request on fallback.
    model: str | None
    degraded_from: str | None
    attempts: int
    retry_stopped_by: StopReason | None
    response: ResponseSummary | None
    budget: BudgetSnapshot
    #: Seconds the call waited in local queues for concurrency slots, all attempts.
    queued: float = 0.0
    #: Seconds it waited for its key's quota, and the quota 429s it was paced after.
    quota_wait: float = 0.0
    paced_429s: int = 0


CallEvent = PrecheckPassed | AttemptEnded | BudgetRefused | FellBack | FirstChunk | CallEnded


class CallObserver(Protocol):
    """Receives the events of one logical call."""

    def on_event(self, event: CallEvent) -> None:
        """Any event but ``AttemptStarted``; ``CallEnded`` comes exactly once, last."""

    def attempt_started(self, event: AttemptStarted) -> Mapping[str, str]:
        """An attempt begins; returns headers to add to its request (``traceparent``)."""

    def active(self) -> AbstractContextManager[None]:
        """Entered around the driver's work on the call (pre-check, attempts, sleeps)."""

    def sending(self) -> AbstractContextManager[None]:
        """Entered around the HTTP send of the current attempt."""


class Observer(Protocol):
    """One per client: hands out a ``CallObserver`` per call, hears breaker and
    ejection changes."""

    def start_call(self, event: CallStarted) -> CallObserver | None:
        """None: nothing to record for this call (the call then emits nothing)."""

    def breaker_changed(self, transition: BreakerTransition) -> None:
        """A breaker of the client changed state (called in the thread that caused it)."""

    def endpoint_changed(self, transition: EjectionTransition) -> None:
        """An endpoint of the client was ejected, put on probation or restored (called
        in the thread that caused it; an observer without this method is not told)."""
