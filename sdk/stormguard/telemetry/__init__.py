"""OpenTelemetry for stormguard: spans and metrics of every call (docs/tracing.md).

``Telemetry`` is on by default and uses the global providers, which are
no-ops until the program configures OpenTelemetry (then a call records
nothing and costs next to nothing). ``configure_otlp`` is that configuration
in one call, for the ``otlp`` extra.
"""

from .._events import (
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
