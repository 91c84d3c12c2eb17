"""The call's telemetry: the events its observer receives, and the scopes a driver
enters around the call and each send. The pipeline knows no OpenTelemetry type.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING

from .._core.verdict import classify
from ..telemetry._events import CallEnded, CallStarted, FirstChunk, ResponseSummary
from .call_base import CallBase
from .call_state import CallState

if TYPE_CHECKING:
    from ..telemetry._events import CallObserver


__all__ = ["ended", "first_chunk", "observing", "sending", "started_event"]

_NO_SCOPE: AbstractContextManager[None] = contextlib.nullcontext()


def started_event(call: CallBase) -> CallStarted:
    spec, body = call.spec, call.spec.body
    max_tokens = None
    if body is not None:
        value = body.get(
            "max_tokens", body.get("max_completion_tokens", body.get("max_output_tokens"))
        )
        max_tokens = value if isinstance(value, int) else None
    return CallStarted(
        operation=spec.operation,
        model=spec.model,
        stream=spec.stream,
        max_tokens=max_tokens,
        server_address=call.core.server_address,
        server_port=call.core.server_port,
        body=body,
        scrub=call.redactor.scrub,
    )


def observing(call: CallBase) -> AbstractContextManager[None]:
    """Entered by the driver around the whole call: the observer's active scope, and
    the call's end when an exception (cancellation included) leaves it."""
    return _NO_SCOPE if call._trace is None else _observing(call, call._trace)


@contextlib.contextmanager
def _observing(call: CallBase, trace: CallObserver) -> Iterator[None]:
    with trace.active():
        try:
            yield
        except BaseException as exc:
            ended(call, exc)
            raise


def sending(call: CallBase) -> AbstractContextManager[None]:
    """Entered by the driver around the HTTP send of an attempt."""
    return _NO_SCOPE if call._trace is None else call._trace.sending()


def first_chunk(call: CallBase, response_id: str | None, response_model: str | None) -> None:
    if call._trace is not None:
        call._trace.on_event(FirstChunk(response_id, response_model))


def ended(
    call: CallBase,
    error: BaseException | None = None,
    *,
    cancelled: bool = False,
    response: ResponseSummary | None = None,
) -> None:
    """The call is over (result, final error, or the caller left); only the first
    report counts. A cancellation is the caller's choice, not the call's failure."""
    if call._quota is not None:
        call._quota.leave()  # a flow dropped while it waited for the quota
    if error is not None and call._lease is not None:
        # A stream that failed after its first chunk (cut by a crash, timed out):
        # its success at the first chunk must not raise the limit.
        call._lease.mark(classify(error).limit_after_first_chunk, call._lease.load)
    call.release_slot()
    if call.machine.step("end") is CallState.DONE or call._trace is None:
        return  # only the first report counts
    if error is not None and not isinstance(error, Exception):
        error, cancelled = None, True  # CancelledError, KeyboardInterrupt, GeneratorExit
    call._trace.on_event(
        CallEnded(
            error=error,
            cancelled=cancelled,
            model=call.spec.model,
            degraded_from=call.degraded_from,
            attempts=call.total_attempts,
            retry_stopped_by=call.retry_stopped_by,
            response=response,
            budget=call.core.budget.state(),
            queued=call.queued_s,
            quota_wait=0.0 if call._quota is None else call._quota.wait_s,
            paced_429s=0 if call._quota is None else call._quota.paced,
        )
    )
