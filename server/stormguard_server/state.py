"""What one running server holds: config, engine, faults, admission, metrics, clock and
the quota.

Routes, the admin app and the middlewares all reach the same objects through
one ``ServerState`` kept on ``app.state.stormguard``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from starlette.requests import HTTPConnection

from stormguard_server.admission.controller import AdmissionController
from stormguard_server.clock import Clock
from stormguard_server.config import ServerConfig
from stormguard_server.engine.base import Engine
from stormguard_server.engine.faults import FaultState
from stormguard_server.quota.buckets import Quota
from stormguard_server.telemetry.metrics import ServerMetrics
from stormguard_server.telemetry.records import RequestObserver
from stormguard_server.telemetry.tracing import ServerTracing


@dataclass
class ServerState:
    config: ServerConfig
    engine: Engine
    faults: FaultState | None
    admission: AdmissionController | None
    metrics: ServerMetrics
    # Every generation request's record goes to each of these (metrics first;
    # tracing or a benchmark recorder can be appended).
    observers: list[RequestObserver] = field(default_factory=list)
    # Server spans (off unless a tracer provider was given): the request span
    # middleware, and the observer that draws admission and engine spans.
    tracing: ServerTracing | None = None
    # The clock every part of this server reads (clock.py): its engine, admission,
    # request limits, flights and spans were built with this one.
    clock: Clock = field(default_factory=Clock)
    # Each API key's quota (quota/buckets.py): None unless a limit is set.
    quota: Quota | None = None

    def __post_init__(self) -> None:
        if self.metrics not in self.observers:
            self.observers.insert(0, self.metrics)
        if self.tracing is not None and self.tracing.observer not in self.observers:
            self.observers.append(self.tracing.observer)

    @property
    def served_models(self) -> tuple[str, ...]:
        """The engine's model name first, then the aliases served by the same engine."""
        return (self.engine.model, *self.config.model_aliases)

    def load_headers(self) -> dict[str, str]:
        """The load headers for a response now; none when admission is off."""
        if self.admission is None:
            return {}
        return self.admission.server_load().to_headers()


def get_state(conn: HTTPConnection) -> ServerState:
    """The server state of the app serving this request."""
    state: ServerState = conn.app.state.stormguard
    return state
