"""Ejection: an endpoint goes out of rotation at the speed of the evidence.

A client with several servers (``_policies/routing/picker.py``) must stop sending to the one
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
  rule, ``Verdict.breaker_failure``: 500/502/504, timeouts, broken bodies).
  ``consecutive_failures`` in a row (5: Envoy's ``consecutive_5xx``), or a
  success rate over the last ``interval`` (10 s) that is an outlier against
  the other endpoints, eject the endpoint for ``base_ejection_time`` times the
  times it was ejected (10 s, 20 s, ... at most 120 s; the multiplier falls by
  one for each ``interval`` spent back in rotation, as Envoy's and gRPC's do).

Three rules keep ejection from making things worse (Envoy's and gRPC's): never
the last endpoint of a model, and at most ``max_ejected_share`` of the
endpoints ejected on failures at once (both in ``_policies/routing/ejection_rules.py``, with the
success-rate rule and why it differs from Envoy's), and **probation** on
return: the first ``probation_successes`` (2) calls are a test, and a failure
among them ejects the endpoint again at once, for longer. The concurrency limit
restarts from its floor on every ejection, so those calls go one at a time at
first (``EndpointLimit.went_down``, ``_policies/limiter/endpoint_limit.py``).

This module holds the tracker: the records, the lock and the status changes.
The rules it asks are ``_policies/routing/ejection_rules.py``, its settings
``_policies/routing/ejection_config.py``, the status and its frozen copies
``_policies/routing/ejection_status.py``, the connect check ``_io/connect_check.py``.

Hand-written: no library does outlier detection for a client-side balancer in
Python. One lock for every endpoint's record, never held across I/O or a
listener; connect checks run in threads of their own (``run_probe``).
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from ..._core.clock import Clock
from ..._core.fork import fork_safe_lock
from ..._core.outbox import Outbox
from ..._core.sliding_window import SlidingWindowCounts
from ..._io.connect_check import connect_check, probe_address, run_in_thread
from .ejection_config import ConnectProbe, EjectionConfig
from .ejection_rules import (
    UNREACHABLE,
    Evidence,
    ejection_time,
    may_eject,
    next_reconnect_backoff,
    reason_to_eject,
    reconnect_wait,
)
from .ejection_status import EjectionListener, EjectionTransition, EndpointHealth, EndpointStatus
from .ejection_status import _Record as _Record

if TYPE_CHECKING:
    from .endpoint_state import EndpointState

__all__ = ["EjectionTracker"]


#: Named for the module it was first written in: the name users filter on.
logger = logging.getLogger("stormguard._ejection")


class EjectionTracker:
    """Ejection state of every endpoint of a client; thread-safe and usable from asyncio.

    ``states`` returns the client's endpoints now (a list that may change);
    each one's record lives on its ``EndpointState`` (``ejection``), so an
    endpoint keeps it as long as it stays in that list. ``run_probe`` runs a
    connect check (a thread of its own by default; a test runs it inline).

    >>> from stormguard.testing import FakeClock
    >>> from stormguard._policies.routing.endpoint_config import Endpoint
    >>> from stormguard._policies.routing.endpoint_state import EndpointState
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
        run_probe: Callable[[Callable[[], None]], None] = run_in_thread,
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
        self._lock = fork_safe_lock()
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
                if record.reason == UNREACHABLE and self._probe is not None:
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
            elif evidence is Evidence.OUT_OF_QUOTA:  # the account, not the server: not counted
                reason = reason_to_eject(
                    state, record, evidence, states=self._states, config=self.config
                )
                if reason is not None:
                    ejected = self._eject(state, record, reason, now)
            else:
                record.window.add(b=1)
                record.consecutive += 1
                reason = reason_to_eject(
                    state, record, evidence, states=self._states, config=self.config
                )
                if reason is not None:
                    ejected = self._eject(state, record, reason, now)
        self._emit()
        return ejected

    # -- ejection ------------------------------------------------------------------------

    def _eject(self, state: EndpointState, record: _Record, reason: str, now: float) -> bool:
        unreachable = reason == UNREACHABLE
        if not may_eject(state, self._states(), self.config, counted=not unreachable):
            return False
        if unreachable:
            record.backoff = next_reconnect_backoff(record.backoff, self.config)
            out_for = reconnect_wait(record.backoff, self.config, self._rng)
        else:
            record.multiplier, out_for = ejection_time(
                record.multiplier, now - record.returned_at, self.config, self._rng
            )
        record.until = now + out_for
        record.ejections += 1
        record.consecutive = 0
        record.probing = False
        self._change(state, record, EndpointStatus.EJECTED, reason, now, out_for)
        return True

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
        host, port = probe_address(state.base_url)
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
                record.backoff = next_reconnect_backoff(record.backoff, self.config)
                out_for = reconnect_wait(record.backoff, self.config, self._rng)
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
        """Hand pending transitions to the listeners (``_core/outbox.py``), without the lock."""
        self._outbox.deliver()


def _describe_ejection_transition(transition: EjectionTransition) -> str:
    return f"Ejection of {transition.endpoint}, {transition.reason}"
