"""One logical call, written once for both drivers: a flow that yields the I/O it needs.

``call_flow`` is the whole call as ``attempt_flow`` is one attempt: the
fallback loop, the first look of a DNS name, the token pre-check, the rate
limiter's wait, and the retry loop with its backoff sleeps, each attempt run
by ``yield from attempt_flow``. A driver (``_call/drivers.py``) runs it with
``run_sync``/``run_async``, performing each action with its own I/O, so the
order of the call's steps is written down once.

The retry loop is tenacity's own (``Retrying.iter``, the step its
``__iter__`` repeats), driven here instead of inside tenacity, so that a
backoff is a ``Sleep`` the driver performs on the client's clock (``time.sleep``
or ``await anyio.sleep``, or a ``FakeClock``'s), with the same strategies either
way. The loop is built when the first attempt has failed, and that attempt's
outcome enters it as the loop's own first: a call that succeeds at once never
pays for it.
"""

from __future__ import annotations

import sys
from collections.abc import Generator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeAlias

import tenacity

from .._core.exceptions import StormguardError
from .._core.stop_reason import StopReason
from .._policies.quota import SharedAsk
from .attempt_flow import Action, attempt_flow
from .attempt_record import stop_open_attempt

if TYPE_CHECKING:
    from .._core.deadline import Deadline
    from .._core.http import httpx
    from .call_precheck import PrecheckFlow
    from .pipeline import LogicalCall

__all__ = [
    "AwaitDiscovery",
    "CallAction",
    "CallFlow",
    "CheckTokens",
    "Sleep",
    "call_flow",
    "hedge_flow",
]


@dataclass(frozen=True, slots=True)
class AwaitDiscovery:
    """Wait (by ``deadline``) for a DNS name's first look, if it is still running."""

    deadline: Deadline


@dataclass(frozen=True, slots=True)
class CheckTokens:
    """Run the token pre-check's lookups (``tokens/_flow.py``); send back its ``Precheck``."""

    flow: PrecheckFlow


@dataclass(frozen=True, slots=True)
class Sleep:
    """Sleep ``seconds`` (a backoff, the token rate limiter's wait, or a wait for the
    key's quota); cancellable."""

    seconds: float


#: ``SharedAsk``: reserve in the key's bucket shared in Redis (``_policies/quota``); the
#: driver sends back the reply, or the error that stood for it (never raised).
CallAction: TypeAlias = Action | AwaitDiscovery | CheckTokens | Sleep | SharedAsk
CallFlow: TypeAlias = Generator[CallAction, Any, Any]


def call_flow(call: LogicalCall, http: httpx.Client | httpx.AsyncClient) -> CallFlow:
    """The whole of ``call``; returns its answer (``call.finish``) or raises its
    error, annotated with the call's attempts and stop reason."""
    # In the observer's scope only when there is one: a ``with`` on the null scope
    # keeps its bound ``__exit__`` alive across every wait of the call.
    return _call(call, http) if call._trace is None else _observed(call, _call(call, http))


def hedge_flow(call: LogicalCall, http: httpx.Client | httpx.AsyncClient) -> CallFlow:
    """A hedge (``_call/hedge_race.py``): one attempt and no more, to the endpoint
    chosen for it; no pre-check (the call's passed), no wait for a quota (a call
    whose key is paced sends none), no retry (the call's own attempts retry), no
    fallback (the call's own decide that)."""
    flow = _hedge(call, http)
    return flow if call._trace is None else _observed(call, flow)


def _hedge(call: LogicalCall, http: httpx.Client | httpx.AsyncClient) -> CallFlow:
    try:
        result = yield from attempt_flow(call, http)
    except StormguardError as exc:
        call.retry_stopped_by = StopReason.MAX_ATTEMPTS  # a hedge is one attempt
        call.annotate(exc)
        raise
    except BaseException:  # cancelled: it lost the race, or the caller left
        call.retry_stopped_by = StopReason.CANCELLED
        stop_open_attempt(call)
        raise
    call.attempt_judged()
    return call.finish(result)


def _observed(call: LogicalCall, flow: CallFlow) -> CallFlow:
    with call.observing():
        return (yield from flow)


def _call(call: LogicalCall, http: httpx.Client | httpx.AsyncClient) -> CallFlow:
    try:
        while True:
            try:
                result = yield from _model_flow(call, http)
                break
            except StormguardError as exc:
                if not call.fall_back(exc):
                    raise
    except StormguardError as exc:
        call.annotate(exc)
        raise
    return call.finish(result)


def _model_flow(call: LogicalCall, http: httpx.Client | httpx.AsyncClient) -> CallFlow:
    """Pre-check, then attempts with retries, on the call's current model."""
    if call.core.discovery is not None:
        yield AwaitDiscovery(call.deadline)
    precheck = call.precheck_flow()
    if precheck is not None:
        wait = call.prechecked((yield CheckTokens(precheck)))
        if wait > 0:
            yield Sleep(wait)
    # The first attempt runs before tenacity's loop is built: most calls end with it,
    # and the loop's set-up and first steps cost a call about 15 us. A first attempt
    # that fails enters the loop as the loop's own first attempt (its outcome set on
    # it), so from there on tenacity decides exactly as it would have.
    result, first = yield from _attempt(call, http)
    if first is None:
        call.attempt_judged()  # what the retry strategy does with a success
        return result
    retrying = tenacity.Retrying(sleep=_unused_sleep, **call.retrying_kwargs())
    retrying.begin()
    state = tenacity.RetryCallState(retrying, fn=None, args=(), kwargs={})
    try:
        do = retrying.iter(state)
        assert isinstance(do, tenacity.DoAttempt)  # a loop's first step is an attempt
        state.set_exception(first)
        del first  # no cycle through the traceback
        while True:
            do = retrying.iter(state)
            if isinstance(do, tenacity.DoAttempt):
                result, failure = yield from _attempt(call, http)
                if failure is None:
                    state.set_result(result)
                else:
                    state.set_exception(failure)
                del failure
            elif isinstance(do, tenacity.DoSleep):
                state.prepare_for_next_attempt()
                yield Sleep(float(do))
            else:
                return do
    finally:
        # tenacity keeps its last step's actions (bound methods of ``retrying``) in its
        # thread-local state, a cycle that would hold the call until the cyclic GC ran;
        # and an error's traceback holds this frame, so ``state`` must not hold the error.
        retrying.iter_state.reset()
        state.outcome = None


def _attempt(call: LogicalCall, http: httpx.Client | httpx.AsyncClient) -> CallFlow:
    """One attempt, after the call's share of its key's quota (``call.pace``: a
    ``Sleep`` until it is granted, re-asked at least every ``recheck`` seconds; a
    ``SharedAsk`` first when the key's bucket is shared in Redis):
    ``(its result, None)``, or ``(None, the exc_info of its failure)`` for the
    retry strategy to judge, as tenacity's own loop catches it."""
    try:
        pace = call.pace()
        while pace is not None:
            if isinstance(pace, SharedAsk):
                pace = call.answered(pace, (yield pace))
                continue
            yield Sleep(pace.seconds)
            pace = None if pace.granted else call.pace()
        return (yield from attempt_flow(call, http)), None
    except GeneratorExit:
        call.left_pacing()
        raise  # the driver dropped the flow: nothing more may be asked of it
    except BaseException:
        call.left_pacing()
        return None, sys.exc_info()


def _unused_sleep(seconds: float) -> None:  # pragma: no cover - the flow yields Sleep instead
    raise AssertionError("call_flow sleeps through its driver")
