"""The call whose work is running in this context (``CURRENT``): a call's trace
(``_call_trace``) sets it while the driver works on the call, and ``Telemetry`` puts
a breaker's or an endpoint's transition on its span.

It lives below both: the trace imports OpenTelemetry and loads with the first call
that records, and the observer reads the current call without loading it, through
what it needs of one (``CurrentCall``).
"""

from __future__ import annotations

import contextvars
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from opentelemetry.trace import Span

__all__ = ["CURRENT", "CurrentCall"]


class CurrentCall(Protocol):
    """A call's trace as the observer uses it (``_call_trace.CallTrace``)."""

    #: The logical span, and whether it records (its attributes are built only then).
    span: Span
    recording: bool


CURRENT: contextvars.ContextVar[CurrentCall | None] = contextvars.ContextVar(
    "stormguard_call", default=None
)
