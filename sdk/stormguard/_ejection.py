"""Ejection: an endpoint goes out of rotation at the speed of the evidence.

A client with several servers (``_endpoints.py``) must stop sending to the one
that cannot serve, and a retry budget is the wrong tool for it: the budget
protects a sick server from extra load, it does not say where the next call
should go. Two kinds of evidence, two speeds (docs/breakers.md has the table):

* **Unreachable**: a refused connection, or a connection reset before any byte
  of the response. Nothing listens there, or the process died under the
  request: one attempt proves it, so the endpoint is out at once, for every
  model (it is the server, not a model), as gRPC's subchannel goes to
  TRANSIENT_FAILURE on its first failed connect. It comes back through a
  **connect check** (a TCP connect in a thread of its own, no request), timed
  by gRPC's connection backoff: 1 s, x 1.6 after each failed check, +-20 %
  jitter, but at most 5 s apart where gRPC waits up to 120 s: a connect check
  costs the server an accept and a close, and a longer wait kept a restarted
  replica idle for a third of its outage (a 30 s outage in the fleet drill:
  checks 10 s apart by then, the replica rejoined 9-12 s after it was ready;
  gRPC's reconnect is a whole connection, often TLS, which is what its cap
  spares). A real call as the re-probe would send one call to a
  dead replica per backoff step; the connect check sends none, and the first
  calls after it are the probation below. ``probe="call"`` (for a client that
  reaches its servers only through a proxy, where a direct connect says
  nothing) lets the first call after the backoff be the probe instead.
* **Failing**: crash-like failures of a server that answers (the breaker's
  rule, ``is_breaker_failure``: 500/502/504, timeouts, broken bodies).
  ``consecutive_failures`` in a row (5: Envoy's ``consecutive_5xx``), or a
  success rate over the last ``interval`` (10 s) that is an outlier against
  the other endpoints, eject the endpoint for ``base_ejection_time`` times the
  times it was ejected (10 s, 20 s, ... at most 120 s; the multiplier falls by
  one for each ``interval`` spent back in rotation, as Envoy's and gRPC's do).

The success-rate rule is Envoy's (``mean - stdev_factor * stdev`` of the
endpoints' success rates, each over at least ``min_requests`` calls), changed
in two ways for the small fleets LLM servers come in. The mean and deviation
are those of the *other* endpoints: with Envoy's own, one sick host of two
raises the deviation enough to hide itself ({50 %, 100 %}: mean 75, stdev 25,
threshold 27.5), which is why Envoy needs five hosts before it judges any.
And the gap below the mean is at least ``success_rate_margin`` (0.3): with
the others at 100 % the deviation is 0, and a single failure must not eject.
With 20 % transient errors everywhere, an endpoint is ejected on noise only
when 6 of its 10 calls fail (0.6 % of windows of 10); one failing half its
calls is out after about five failures.

Three rules keep ejection from making things worse (Envoy's and gRPC's):

* never the last endpoint of a model: an endpoint is ejected only while every
  model it serves is still served by another endpoint in rotation; a client
  with one endpoint is never ejected (its breaker fails calls fast instead);
* at most ``max_ejected_share`` (0.5) of the endpoints ejected on failures at
  once, but always one (gRPC's A50): past half the fleet, failures more likely
  have a common cause (the requests, a dependency) than many sick replicas,
  and ejecting more would pile the whole load on the few left. Unreachable
  endpoints do not count against the share: they serve nothing either way
  (gRPC keeps connectivity apart from outlier ejection the same way);
* **probation** on return: the first ``probation_successes`` (2) calls are a
  test, and a failure among them ejects the endpoint again at once, for
  longer. The concurrency limit restarts from its floor on every ejection, so
  those calls go one at a time at first (``_limiter.py``, ``went_down``).

A shed (429/503 for capacity, a restarting engine) is neither success nor
failure here: overload is not connectivity, and the concurrency limit paces it.

Hand-written: no library does outlier detection for a client-side balancer in
Python. One lock for every endpoint's record, never held across I/O or a
listener; connect checks run in threads of their own (``run_probe``).
"""

from __future__ import annotations

import enum
import logging
import math
import random
import socket
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from ._breaker import is_breaker_failure
from ._clock import Clock
from ._exceptions import APIConnectionError, APITimeoutError
from ._http import httpx
from ._outbox import Outbox
from ._sliding_window import SlidingWindowCounts
from .protocol import Priority

if TYPE_CHECKING:
    from ._endpoints import EndpointState

__all__ = [
    "ConnectProbe",
    "EjectionConfig",
    "EjectionListener",
    "EjectionTracker",
    "EjectionTransition",
    "EndpointHealth",
    "EndpointStatus",
    "Evidence",
    "connect_check",
    "evidence_of",
]

logger = logging.getLogger(__name__)

#: ``(host, port, timeout) -> reachable``: how a connect check is made.
ConnectProbe = Callable[[str, int, float], bool]


class EndpointStatus(str, enum.Enum):
    """Whether calls may go to an endpoint."""

    #: In rotation.
    ACTIVE = "active"
    #: Out of rotation until its ejection ends (or, unreachable, a connect check passes).
    EJECTED = "ejected"
    #: Back in rotation on trial: a failure before ``probation_successes`` ejects it again.
    PROBATION = "probation"


class Evidence(str, enum.Enum):
    """What one attempt says about its endpoint."""

    SUCCESS = "success"
    #: A crash-like failure of a server that answered (``is_breaker_failure``).
    FAILURE = "failure"
    #: Refused, or reset before any byte of the response.
    UNREACHABLE = "unreachable"
    #: Nothing: a shed, a caller error, a refusal made in this process.
    NONE = "none"


def evidence_of(error: BaseException | None, *, response_seen: bool) -> Evidence:
    """The evidence of an attempt that ended in ``error`` (None: it succeeded);
    ``response_seen``: whether any of the response (its status line) had arrived."""
    if error is None:
        return Evidence.SUCCESS
    if (
        isinstance(error, APIConnectionError)
        and not isinstance(error, APITimeoutError)
        and not response_seen
    ):
        return Evidence.UNREACHABLE
    if is_breaker_failure(error):
        return Evidence.FAILURE
    return Evidence.NONE


@dataclass(frozen=True, kw_only=True)
class EjectionConfig:
    """When an endpoint leaves rotation and how it comes back (docs/breakers.md).

    >>> EjectionConfig().base_ejection_time, EjectionConfig().max_ejected_share
    (10.0, 0.5)
    >>> EjectionConfig(consecutive_failures=None, probe="call").probe
    'call'
    """

    #: gRPC's connection backoff (doc/connection-backoff.md): the first connect check
    #: comes ``reconnect_backoff`` after the endpoint was found unreachable, each
    #: failed one multiplies the wait by ``reconnect_multiplier``, +-``reconnect_jitter``,
    #: up to ``max_reconnect_backoff`` (gRPC's 120 s would leave a restarted replica
    #: idle for up to two minutes; a TCP connect every 5 s costs a server nothing).
    reconnect_backoff: float = 1.0
    reconnect_multiplier: float = 1.6
    reconnect_jitter: float = 0.2
    max_reconnect_backoff: float = 5.0
    #: ``"connect"``: a TCP connect decides whether an unreachable endpoint is back
    #: (no call is sent to it before). ``"call"``: the first call after the backoff
    #: is the probe. Or a function ``(host, port, timeout) -> reachable``.
    probe: Literal["connect", "call"] | ConnectProbe = "connect"
    #: Seconds a connect check may take (it runs in a thread: no call waits for it).
    probe_timeout: float = 5.0
    #: Crash-like failures in a row that eject (Envoy's ``consecutive_5xx``); None: off.
    consecutive_failures: int | None = 5
    #: The window of the success-rate rule, in seconds (Envoy's ``interval``).
    interval: float = 10.0
    #: Calls in the window below which an endpoint is not judged (nor compared with).
    min_requests: int = 10
    #: Envoy's ``success_rate_stdev_factor`` (1900 / 1000).
    stdev_factor: float = 1.9
    #: The least gap below the others' mean success rate that ejects.
    success_rate_margin: float = 0.3
    #: False turns the success-rate rule off.
    success_rate: bool = True
    base_ejection_time: float = 10.0
    max_ejection_time: float = 120.0
    #: An ejection is lengthened by up to this share (never shortened), so that the
    #: clients a fault ejected together do not all return in the same second.
    jitter: float = 0.1
    #: Ejections on failures may take out at most this share of the endpoints (one
    #: always may, but never the last of a model).
    max_ejected_share: float = 0.5
    #: Successes that end an endpoint's probation after it returns.
    probation_successes: int = 2

    def __post_init__(self) -> None:
        for name in (
            "reconnect_backoff",
            "max_reconnect_backoff",
            "probe_timeout",
            "interval",
            "base_ejection_time",
            "max_ejection_time",
        ):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
        if self.max_reconnect_backoff < self.reconnect_backoff:
            raise ValueError("max_reconnect_backoff must be >= reconnect_backoff")
        if self.max_ejection_time < self.base_ejection_time:
            raise ValueError("max_ejection_time must be >= base_ejection_time")
        if not (math.isfinite(self.reconnect_multiplier) and self.reconnect_multiplier >= 1):
            raise ValueError("reconnect_multiplier must be a finite number >= 1")
        for name in ("reconnect_jitter", "jitter"):
            value = getattr(self, name)
            if not (math.isfinite(value) and 0 <= value < 1):
                raise ValueError(f"{name} must be in [0, 1), got {value!r}")
        if not (math.isfinite(self.max_ejected_share) and 0 <= self.max_ejected_share <= 1):
            raise ValueError("max_ejected_share must be in [0, 1]")
        if self.consecutive_failures is not None and self.consecutive_failures < 1:
            raise ValueError("consecutive_failures must be at least 1 (or None for off)")
        if self.min_requests < 1 or self.probation_successes < 0:
            raise ValueError("min_requests must be >= 1 and probation_successes >= 0")
        if not (math.isfinite(self.stdev_factor) and self.stdev_factor >= 0):
            raise ValueError("stdev_factor must be a finite number >= 0")
        if not (math.isfinite(self.success_rate_margin) and 0 < self.success_rate_margin <= 1):
            raise ValueError("success_rate_margin must be in (0, 1]")
        if not (self.probe in ("connect", "call") or callable(self.probe)):
            raise ValueError('probe must be "connect", "call" or a function (host, port, timeout)')


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


def connect_check(host: str, port: int, timeout: float) -> bool:
    """Whether a TCP connection to ``host:port`` opens within ``timeout`` (then closed)."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def _in_thread(work: Callable[[], None]) -> None:
    threading.Thread(target=work, name="stormguard-connect-check", daemon=True).start()


_UNREACHABLE = "unreachable"


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


class EjectionTracker:
    """Ejection state of every endpoint of a client; thread-safe and usable from asyncio.

    ``states`` returns the client's endpoints now (a list that may change);
    each one's record lives on its ``EndpointState`` (``ejection``), so an
    endpoint keeps it as long as it stays in that list. ``run_probe`` runs a
    connect check (a thread of its own by default; a test runs it inline).

    >>> from stormguard.testing import FakeClock
    >>> from stormguard._endpoints import Endpoint, EndpointState
    >>> states = [EndpointState(Endpoint(f"http://gpu-{i}:8000/v1")) for i in (1, 2)]
    >>> tracker = EjectionTracker(EjectionConfig(), states=lambda: states, clock=FakeClock())
    >>> tracker.record(states[0], Evidence.UNREACHABLE)
    True
    >>> tracker.usable(states[0]), tracker.usable(states[1])
    (False, True)
    >>> tracker.record(states[1], Evidence.UNREACHABLE)  # never the last one
    False
    """

    def __init__(
        self,
        config: EjectionConfig | None = None,
        *,
        states: Callable[[], Sequence[EndpointState]],
        clock: Clock | None = None,
        rng: random.Random | None = None,
        listeners: Sequence[EjectionListener] = (),
        run_probe: Callable[[Callable[[], None]], None] = _in_thread,
    ) -> None:
        self.config = config if config is not None else EjectionConfig()
        self._states = states
        self._clock = clock or Clock()
        self._rng = rng or random.Random()
        self._run_probe = run_probe
        probe = self.config.probe
        self._probe: ConnectProbe | None = None
        if not isinstance(probe, str):
            self._probe = probe
        elif probe == "connect":
            self._probe = connect_check
        self._lock = threading.Lock()
        self._outbox: Outbox[EjectionTransition] = Outbox(
            self._lock, listeners, _describe_ejection_transition, logger
        )

    # -- asked before each attempt -------------------------------------------------------

    def usable(self, state: EndpointState) -> bool:
        """Whether calls may go to ``state`` now (active or on probation). An
        ejection whose time is up ends here: a connect check starts (the endpoint
        stays out until it passes) or the endpoint goes on probation."""
        record = state.ejection
        if record is None or record.status is not EndpointStatus.EJECTED:
            return True  # the common case: no lock
        probe: Callable[[], None] | None = None
        with self._lock:
            now = self._clock.now()
            if record.status is EndpointStatus.EJECTED and now >= record.until:
                if record.reason == _UNREACHABLE and self._probe is not None:
                    if not record.probing:
                        record.probing = True
                        probe = self._probe_for(state, record)
                else:
                    self._to_probation(state, record, "ejection_time_elapsed", now)
            usable = record.status is not EndpointStatus.EJECTED
        if probe is not None:
            self._run_probe(probe)
        self._emit()
        return usable

    def retry_in(self, state: EndpointState) -> float | None:
        """Seconds until an ejected endpoint may return (None: it is not ejected)."""
        record = state.ejection
        if record is None or record.status is not EndpointStatus.EJECTED:
            return None
        return max(record.until - self._clock.now(), 0.0)

    # -- told after each attempt ---------------------------------------------------------

    def record(
        self, state: EndpointState, evidence: Evidence, *, sent_at: float | None = None
    ) -> bool:
        """Count one attempt's evidence; True when it ejected the endpoint. An attempt
        sent (``sent_at``, clock time) before the endpoint last returned to rotation
        says nothing about it now, as one that ends while it is ejected."""
        if evidence is Evidence.NONE:
            return False
        with self._lock:
            now = self._clock.now()
            record = self._record_of(state)
            stale = sent_at is not None and sent_at < record.returned_at
            if record.status is EndpointStatus.EJECTED or stale:
                return False
            ejected = False
            if evidence is Evidence.SUCCESS:
                record.window.add(a=1)
                record.consecutive = 0
                if record.status is EndpointStatus.PROBATION:
                    record.probation_left -= 1
                    if record.probation_left <= 0:
                        record.backoff = 0.0
                        self._change(state, record, EndpointStatus.ACTIVE, "probation_passed", now)
            else:
                record.window.add(b=1)
                record.consecutive += 1
                reason = self._reason_to_eject(state, record, evidence)
                if reason is not None:
                    ejected = self._eject(state, record, reason, now)
        self._emit()
        return ejected

    def _reason_to_eject(
        self, state: EndpointState, record: _Record, evidence: Evidence
    ) -> str | None:
        config = self.config
        if evidence is Evidence.UNREACHABLE:
            return _UNREACHABLE
        if record.status is EndpointStatus.PROBATION:
            return "probation_failed"
        if config.consecutive_failures is not None and (
            record.consecutive >= config.consecutive_failures
        ):
            return "consecutive_failures"
        if config.success_rate and self._outlier(state, record):
            return "success_rate"
        return None

    def _outlier(self, state: EndpointState, record: _Record) -> bool:
        """Envoy's success-rate rule against the other endpoints (the module docstring)."""
        config = self.config
        successes, failures = record.window.totals()
        calls = successes + failures
        if calls < config.min_requests:
            return False
        rates: list[float] = []
        for other in self._states():
            theirs = other.ejection
            if other is state or theirs is None or theirs.status is EndpointStatus.EJECTED:
                continue
            ok, failed = theirs.window.totals()
            if ok + failed >= config.min_requests:
                rates.append(ok / (ok + failed))
        if not rates:
            return False
        import statistics  # only with several endpoints to compare: not on import

        mean, stdev = statistics.fmean(rates), statistics.pstdev(rates)
        threshold = mean - max(config.stdev_factor * stdev, config.success_rate_margin)
        return successes / calls < threshold

    # -- ejection ------------------------------------------------------------------------

    def _eject(self, state: EndpointState, record: _Record, reason: str, now: float) -> bool:
        if not self._may_eject(state, counted=reason != _UNREACHABLE):
            return False
        config = self.config
        if reason == _UNREACHABLE:
            backoff = record.backoff * config.reconnect_multiplier if record.backoff else 0.0
            record.backoff = min(
                max(backoff, config.reconnect_backoff), config.max_reconnect_backoff
            )
            spread = config.reconnect_jitter * record.backoff
            out_for = record.backoff + self._rng.uniform(-spread, spread)
        else:
            # Envoy's multiplier: one more per ejection, one less per interval back in rotation.
            healthy = now - record.returned_at
            fell = int(healthy // config.interval) if math.isfinite(healthy) else record.multiplier
            record.multiplier = max(record.multiplier - fell, 0) + 1
            grown = min(config.base_ejection_time * record.multiplier, config.max_ejection_time)
            out_for = grown * self._rng.uniform(1.0, 1.0 + config.jitter)
        record.until = now + out_for
        record.ejections += 1
        record.consecutive = 0
        record.probing = False
        self._change(state, record, EndpointStatus.EJECTED, reason, now, out_for)
        return True

    def _may_eject(self, state: EndpointState, *, counted: bool) -> bool:
        """Never the last endpoint of a model, nor of a pool (a priority class, for
        that model); failures eject at most the share."""
        states = list(self._states())
        serving = [s for s in states if s is not state and not _ejected(s)]
        models: Iterable[str | None] = (None,) if state.models is None else state.models
        classes = tuple(Priority) if state.classes is None else state.classes
        for model in models:
            # An endpoint serving any model is covered only by another one that does.
            peers = [s for s in serving if (s.models is None if model is None else s.serves(model))]
            if not all(any(s.serves_class(c) for s in peers) for c in classes):
                return False
        if not counted:
            return True
        ejected = sum(1 for s in states if s is not state and _ejected_on_failures(s))
        return ejected == 0 or (ejected + 1) / len(states) <= self.config.max_ejected_share

    def _to_probation(self, state: EndpointState, record: _Record, reason: str, now: float) -> None:
        record.probation_left = self.config.probation_successes
        record.returned_at = now
        record.consecutive = 0
        record.probing = False
        if record.probation_left <= 0:
            self._change(state, record, EndpointStatus.ACTIVE, reason, now)
        else:
            self._change(state, record, EndpointStatus.PROBATION, reason, now)

    def _probe_for(self, state: EndpointState, record: _Record) -> Callable[[], None]:
        """The connect check of an unreachable endpoint, to run outside the lock."""
        probe = self._probe
        assert probe is not None
        url = httpx.URL(state.base_url)
        host = url.host
        port = url.port or (443 if url.scheme == "https" else 80)
        until = record.until
        timeout = self.config.probe_timeout

        def check() -> None:
            try:
                reachable = probe(host, port, timeout)
            except Exception:  # a probe function of the user's that raised
                logger.exception("Connect check of %s failed", state.name)
                reachable = False
            self._probed(state, until, reachable)

        return check

    def _probed(self, state: EndpointState, until: float, reachable: bool) -> None:
        with self._lock:
            record = state.ejection
            if (
                record is None
                or record.until != until
                or record.status is not EndpointStatus.EJECTED
            ):
                return  # the endpoint moved on meanwhile
            now = self._clock.now()
            record.probing = False
            if reachable:
                self._to_probation(state, record, "reachable", now)
            else:
                config = self.config
                record.backoff = min(
                    record.backoff * config.reconnect_multiplier, config.max_reconnect_backoff
                )
                spread = config.reconnect_jitter * record.backoff
                out_for = record.backoff + self._rng.uniform(-spread, spread)
                record.until = now + out_for
                self._change(state, record, EndpointStatus.EJECTED, "probe_failed", now, out_for)
        self._emit()

    # -- state ---------------------------------------------------------------------------

    def _record_of(self, state: EndpointState) -> _Record:
        record = state.ejection
        if record is None:
            window = SlidingWindowCounts(window=self.config.interval, buckets=10, clock=self._clock)
            record = state.ejection = _Record(window)
        return record

    def _change(
        self,
        state: EndpointState,
        record: _Record,
        to: EndpointStatus,
        reason: str,
        now: float,
        ejected_for: float | None = None,
    ) -> None:
        before, record.status = record.status, to
        if to is EndpointStatus.EJECTED and before is not EndpointStatus.EJECTED:
            record.reason = reason  # a failed connect check keeps the cause: unreachable
        if self._outbox.listening:
            self._outbox.put(EjectionTransition(state.name, before, to, reason, now, ejected_for))

    def snapshot(self) -> tuple[EndpointHealth, ...]:
        """Every endpoint's status, why it was last ejected and for how long still."""
        healths: list[EndpointHealth] = []
        with self._lock:
            now = self._clock.now()
            for state in self._states():
                record = self._record_of(state)
                ejected = record.status is EndpointStatus.EJECTED
                ok, failed = record.window.totals()
                healths.append(
                    EndpointHealth(
                        endpoint=state.name,
                        status=record.status,
                        reason=record.reason,
                        ejected_for=max(record.until - now, 0.0) if ejected else None,
                        ejections=record.ejections,
                        consecutive_failures=record.consecutive,
                        successes=ok,
                        failures=failed,
                    )
                )
        return tuple(healths)

    # -- outside the lock ----------------------------------------------------------------

    def _emit(self) -> None:
        """Hand pending transitions to the listeners (``_outbox.py``), without the lock."""
        self._outbox.deliver()


def _describe_ejection_transition(transition: EjectionTransition) -> str:
    return f"Ejection of {transition.endpoint}, {transition.reason}"


def _ejected(state: EndpointState) -> bool:
    record = state.ejection
    return record is not None and record.status is EndpointStatus.EJECTED


def _ejected_on_failures(state: EndpointState) -> bool:
    record = state.ejection
    return (
        record is not None
        and record.status is EndpointStatus.EJECTED
        and record.reason != _UNREACHABLE
    )
