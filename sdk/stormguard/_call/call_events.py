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


__all__ = ["CallEvents"]

_NO_SCOPE: AbstractContextManager[None] = contextlib.nullcontext()


class CallEvents(CallBase):
    """Telemetry of the call: events for its observer."""

    def _started_event(self) -> CallStarted:
        spec, body = self.spec, self.spec.body
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
            server_address=self.core.server_address,
            server_port=self.core.server_port,
            body=body,
            scrub=self.redactor.scrub,
        )

    def observing(self) -> AbstractContextManager[None]:
        """Entered by the driver around the whole call: the observer's active scope, and
        the call's end when an exception (cancellation included) leaves it."""
        return _NO_SCOPE if self._trace is None else self._observing(self._trace)

    @contextlib.contextmanager
    def _observing(self, trace: CallObserver) -> Iterator[None]:
        with trace.active():
            try:
                yield
            except BaseException as exc:
                self.ended(exc)
                raise

    def sending(self) -> AbstractContextManager[None]:
        """Entered by the driver around the HTTP send of an attempt."""
        return _NO_SCOPE if self._trace is None else self._trace.sending()

    def first_chunk(self, response_id: str | None, response_model: str | None) -> None:
        if self._trace is not None:
            self._trace.on_event(FirstChunk(response_id, response_model))

    def ended(
        self,
        error: BaseException | None = None,
        *,
        cancelled: bool = False,
        response: ResponseSummary | None = None,
    ) -> None:
        """The call is over (result, final error, or the caller left); only the first
        report counts. A cancellation is the caller's choice, not the call's failure."""
        if self._quota is not None:
            self._quota.leave()  # a flow dropped while it waited for the quota
        if error is not None and self._lease is not None:
            # A stream that failed after its first chunk (cut by a crash, timed out):
            # its success at the first chunk must not raise the limit.
            self._lease.mark(classify(error).limit_after_first_chunk, self._lease.load)
        self.release_slot()
        if self.machine.step("end") is CallState.DONE or self._trace is None:
            return  # only the first report counts
        if error is not None and not isinstance(error, Exception):
            error, cancelled = None, True  # CancelledError, KeyboardInterrupt, GeneratorExit
        self._trace.on_event(
            CallEnded(
                error=error,
                cancelled=cancelled,
                model=self.spec.model,
                degraded_from=self.degraded_from,
                attempts=self.total_attempts,
                retry_stopped_by=self.retry_stopped_by,
                response=response,
                budget=self.core.budget.state(),
                queued=self.queued_s,
                quota_wait=0.0 if self._quota is None else self._quota.wait_s,
                paced_429s=0 if self._quota is None else self._quota.paced,
            )
        )
