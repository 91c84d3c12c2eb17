"""The state of one logical call (``CallBase``): every attribute of a call,
declared here once, with the modules that set it.

``pipeline.LogicalCall`` is the call: this state, the steps a driver takes first,
and the steps of its helpers, each a module of functions of this state with one
job (``call_precheck``, ``call_events``, ``call_quota``, ``endpoint_choice``, ``attempt_record``,
``retry_loop``, ``call_result``), which import this module and never the call's
own: the state is below every helper, the call above them all.
"""

from __future__ import annotations

import json
import math
from datetime import timedelta
from typing import TYPE_CHECKING

from .._core.deadline import Deadline
from .._core.history import AttemptRecord
from .._core.http import httpx
from .._core.rate_limit_headers import RateLimit
from .._core.results import CallInfo
from .._core.stop_reason import StopReason
from .._core.verdict import LimitOutcome
from .._policies.limiter.lease import Lease
from ..protocol import HEADER_PRIORITY, Priority, ServerLoad, parse_priority
from .call_state import CallMachine
from .stream_timeouts import StreamBounds

if TYPE_CHECKING:
    from .._core.history import FallbackStep
    from .._core.precheck import Precheck
    from .._policies.breaker.circuit import Permit
    from .._policies.quota import CallQuota, QuotaKey
    from .._policies.routing.endpoint_state import EndpointState
    from ..telemetry._events import CallObserver
    from ..tokens import Reservation
    from .call_spec import CallSpec
    from .client_core import ClientCore


__all__ = ["FAILOVER", "HEDGE_LOST", "OK", "PACED", "REQUEUED", "RETRY", "CallBase"]

#: The outcomes of an attempt besides the stop reasons (``AttemptRecord.outcome``).
OK = "ok"
RETRY = "retry"
FAILOVER = "failover"
REQUEUED = "requeued"
#: A quota 429: the call went back to its key's pacer (``_call/call_quota.py``).
PACED = "paced"
#: The other attempt of a hedged call answered first: this one was cancelled, its
#: connection closed (``_call/hedge_race.py``).
HEDGE_LOST = "hedge_lost"


class CallBase:
    """The state of one logical call; created per call, used by one driver.

    What most calls never change is a class attribute (immutable values only),
    set on the instance when it changes: a call starts with a dozen stores
    instead of forty. Each group says which modules set it (``pipeline`` is
    ``LogicalCall``'s own steps)."""

    # -- What the call reports (``CallInfo``, its error, telemetry) ------------
    #: The ``x-ratelimit-*`` headers and load headers of the last response
    #: (``attempt_record.saw_response``).
    rate_limit: RateLimit = RateLimit()
    server_load: ServerLoad = ServerLoad()
    #: Why the retry loop stopped (``retry_loop``; cleared by ``pipeline.fall_back``).
    retry_stopped_by: StopReason | None = None
    #: Attempts on the current model, and on every model (``pipeline.begin_attempt``).
    attempt_number = 0
    total_attempts = 0
    #: The model first asked for, once the call has moved to a fallback model
    #: because its own could not serve (not for a longer context or a content
    #: filter) (``pipeline.fall_back``).
    degraded_from: str | None = None
    #: The passed token pre-check (``call_precheck.prechecked``).
    precheck: Precheck | None = None
    #: A stream's first-chunk, idle and overall bounds, held in ``deadline``
    #: (``_call/stream_timeouts.py``); None: the deadline alone bounds the call
    #: (``__init__``).
    stream_bounds: StreamBounds | None = None
    #: Seconds the call spent in the local queue, over every attempt (``pipeline.granted``).
    queued_s = 0.0
    #: The record of each attempt closed (``attempt_record.close_record``), the
    #: endpoints the call has sent an attempt to (a failover goes only to others)
    #: (``pipeline.begin_attempt``), and its moves from one model to the next
    #: (``pipeline.fall_back``). Tuples, grown by a new one: a tuple of strings is
    #: no object for the garbage collector to walk while the call waits, and most
    #: calls make one attempt and no move.
    history: tuple[AttemptRecord, ...] = ()
    _tried: tuple[str, ...] = ()
    fallback_steps: tuple[FallbackStep, ...] = ()
    #: The call's observer (telemetry); None when nothing is recorded: no events
    #: then (``pipeline``'s ``__init__``).
    _trace: CallObserver | None = None
    #: This call is a hedge of another (``_call/hedge_race.py``): one attempt, to
    #: another endpoint, its records marked ``hedge``.
    hedge = False

    # -- The current attempt (``pipeline.reserve``/``granted``/``begin_attempt``;
    # -- closed by ``attempt_record``) --------------------------------------------
    #: The endpoint chosen for the attempt (``pipeline.reserve``), the one it went
    #: to while in flight (``pipeline.begin_attempt``; ``attempt_record.close_record``
    #: clears it), and the last one an attempt went to (``attempt_record``).
    _endpoint_choice: EndpointState | None = None
    _endpoint: EndpointState | None = None
    _last_endpoint: str | None = None
    #: The endpoint a stream that succeeded is still being read from: it counts in
    #: that endpoint's load (``picker.started``) until the stream ends, as its
    #: concurrency slot does (``release_slot``).
    _streaming_from: EndpointState | None = None
    #: Whether the endpoint last chosen is its affinity key's home ("hit") or
    #: another ("overflow": the home was full, shedding or tried); None: no
    #: key, or no choice to make (``endpoint_choice.pick_endpoint``); and that of
    #: the attempt in flight (``pipeline.begin_attempt``: a retry's endpoint is
    #: chosen before the failed attempt's record is closed).
    _affinity: str | None = None
    _attempt_affinity: str | None = None
    #: The breaker's permit of the attempt in flight (``pipeline.begin_attempt``;
    #: settled once by ``attempt_record``).
    _permit: Permit | None = None
    #: The concurrency slot of the current attempt (None: no limiter, or none held)
    #: (``pipeline.reserve``/``granted``; ``release_slot`` gives it back).
    _lease: Lease | None = None
    #: The call's place in its endpoint's queue: (its class's rank, its arrival) (``__init__``).
    _limit_key: tuple[int, int] = (Priority.STANDARD.rank, 0)
    #: The request of the current (or last) attempt: the ``request`` of its errors
    #: (``pipeline.begin_attempt``).
    _request: httpx.Request | None = None
    #: The pool the call's I/O goes through, the driver's (``pipeline``'s ``__init__``),
    #: and that of the current (or last) attempt: a stream read when it is closed
    #: ends with ``ClientClosedError`` (``pipeline.begin_attempt``).
    http: httpx.Client | httpx.AsyncClient | None = None
    #: When the attempt was sent, on the client's clock (``pipeline.begin_attempt``).
    _started = 0.0
    #: A stream attempt waiting for its first chunk with ``LatencyRouting`` on: its
    #: endpoint and the picker's key for it (``pipeline.begin_attempt``; ended by
    #: ``attempt_record.end_wait``).
    _waiting: tuple[EndpointState, int] | None = None
    #: Seconds the attempt waited for its slot (``pipeline.reserve``/``granted``).
    _queued_before = 0.0
    #: The failure of the attempt (``attempt_record.failed``; cleared by
    #: ``pipeline.begin_attempt`` and by ``call_result.annotate``).
    _attempt_error: BaseException | None = None
    #: The status, error type and duration of the attempt's record, noted when
    #: known (``attempt_record``; cleared by ``pipeline.begin_attempt``).
    _pending: tuple[int | None, str | None, float] | None = None

    # -- Between attempts (``retry_loop``; reset by ``pipeline.fall_back``) -------
    #: The wait before the current attempt, and the one decided for the next.
    _delay_before = 0.0
    _next_delay = 0.0
    #: The endpoint the next retry goes to, chosen when it was decided (also by
    #: ``endpoint_choice.pace`` with deployments; taken by ``pipeline.reserve``).
    _next_target: EndpointState | None = None
    #: The next retry is a failover: to an endpoint not tried yet, outside the budget.
    _failover = False
    #: Requeues on the current model (sheds sent back to the local queue).
    _requeues = 0
    _requeue_next = False
    #: Paced retries on the current model (quota 429s sent back to the key's pacer).
    _paced = 0
    _paced_next = False
    #: The next attempt resends a requeued or paced call (not a retry).
    _resending = False
    #: The last failed attempt is worth a retry (its ``Verdict``), and whether a
    #: shed can be requeued after it (the limiter's ``LimitOutcome`` of it).
    _retryable = False
    _failure_limit = LimitOutcome.IGNORED
    #: A stop ``wait`` decided (a requeue refused, no retry allowed) for ``stop``.
    _forced_stop: StopReason | None = None
    #: Endpoints this call will not use again: a deployment whose key is out of
    #: quota, or whose quota cannot fit the call's deadline (another tier may)
    #: (``endpoint_choice.skip_credential_of``; reset by ``pipeline.fall_back``).
    _skipped: frozenset[str] = frozenset()

    # -- The call's key's quota (``call_quota``; reset by ``pipeline.fall_back``) --
    #: The call's key (None: not asked yet, or the call has none: no quota policy,
    #: no model, not a POST), its place in the key's quota once the key is paced,
    #: and its cost.
    _quota_key: QuotaKey | None = None
    _quota: CallQuota | None = None
    _quota_cost: float | None = None
    #: The current attempt failed with a quota refusal the pacer paces
    #: (``attempt_record.failed``; cleared by ``call_quota.quota_sent``).
    _quota_refusal = False

    # -- The end of the call (``call_result``) ------------------------------------
    #: The token rate limiter's reservation (``call_precheck.prechecked``), settled or
    #: given back once (``call_result``).
    _reservation: Reservation | None = None
    #: "response" mode: the final response rebuilt with its body, and its elapsed.
    _read: tuple[httpx.Response, timedelta] | None = None
    #: "unread" mode: what the result will say of the call, once its body is read.
    _unread_info: CallInfo | None = None

    def __init__(self, core: ClientCore, spec: CallSpec, *, counted: bool = True) -> None:
        """``counted``: a logical call of its own, for the budgets and stats (a hedge
        is an attempt of another call)."""
        self.core = core
        self.spec = spec
        self.deadline = Deadline(core.clock, spec.timeout)
        if spec.stream:
            self.stream_bounds = StreamBounds.of(
                core.stream_timeouts if spec.stream_timeouts is None else spec.stream_timeouts,
                self.deadline,
                core.clock,
            )
        #: Where the call is (``_call/call_state.py``): each step below moves it, and a
        #: step out of order raises ``CallProtocolError``.
        self.machine = CallMachine()
        self._content = spec.content
        if self._content is None and spec.body is not None:
            self._content = json.dumps(spec.body, separators=(",", ":")).encode()
        #: The models this call has been on (a fallback goes only to others; more are
        #: added by ``pipeline.fall_back``).
        self.models_tried: tuple[str, ...] = () if spec.model is None else (spec.model,)
        if counted:
            core.budget.record_call()
            core.stats.call()
        #: The call's class (its ``x-priority``): its pool of endpoints, its queue rank.
        self.priority = self._priority()
        limiter = core.limiter
        if limiter is not None:
            if counted:
                limiter.requeue_budget.record_call()
            self._limit_key = (self.priority.rank, limiter.next_seq())
        #: Scrubs the client's credentials, and this call's own, from what it shows.
        self.redactor = core.redactor.including(headers=spec.headers, url=spec.absolute_url)

    def _priority(self) -> Priority:
        """The call's ``x-priority``: its own header, else the client's."""
        for name, value in self.spec.headers.items():
            if name.lower() == HEADER_PRIORITY:
                return parse_priority({HEADER_PRIORITY: value})
        return self.core.priority

    def release_slot(self) -> None:
        """Give the attempt's concurrency slot back (with the outcome it was marked with),
        and a stream's place in its endpoint's load."""
        lease, self._lease = self._lease, None
        if lease is not None:
            lease.release()
        streaming_from, self._streaming_from = self._streaming_from, None
        if streaming_from is not None:
            self.core.picker.finished(streaming_from)

    def remaining_or_none(self) -> float | None:
        """Seconds left, or None without a deadline (the form anyio's ``fail_after`` takes)."""
        remaining = self.deadline.remaining()
        return remaining if math.isfinite(remaining) else None
