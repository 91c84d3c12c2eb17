"""OpenTelemetry for stormguard: spans and metrics of every call (docs/tracing.md).

``Telemetry`` is on by default and uses the global providers, which are
no-ops until the program configures OpenTelemetry (then a call records
nothing and costs next to nothing). ``configure_otlp`` is that configuration
in one call, for the ``otlp`` extra.

Nothing here imports OpenTelemetry: the API loads when a call first has a
provider to record to, and ``configure_otlp`` (with the SDK) when it is first
named.
"""

from typing import TYPE_CHECKING, Any

from ._events import (
    AttemptEnded,
    AttemptStarted,
    BudgetRefused,
    CallEnded,
    CallEvent,
    CallObserver,
    CallStarted,
    FellBack,
    FirstChunk,
    Observer,
    PrecheckPassed,
    ResponseSummary,
)
from ._observer import Telemetry

if TYPE_CHECKING:
    from ._otlp import OTLPSetup, configure_otlp

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
    "OTLPSetup",
    "Observer",
    "PrecheckPassed",
    "ResponseSummary",
    "Telemetry",
    "configure_otlp",
]


def __getattr__(name: str) -> Any:
    """``OTLPSetup`` and ``configure_otlp``, loaded when first named."""
    if name in ("OTLPSetup", "configure_otlp"):
        from . import _otlp

        return getattr(_otlp, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
