"""``Telemetry``: the observer that turns a call's events into OpenTelemetry spans and metrics.

One logical span per call (``chat {model}``, kind CLIENT) from the first
pre-check to the end of the answer (a stream's end or close), and one child
CLIENT span per HTTP attempt, whose context goes out as ``traceparent``. Only
opentelemetry-api is used, through its public names: the user brings the SDK
and exporters. With no provider configured, ``start_call`` returns None and the
call emits no events at all; with a provider whose sampler drops the call,
spans are made (their context still propagates) but no attribute is built.

The API itself is imported on first need, not with stormguard: a program that
never imported ``opentelemetry.trace`` or ``opentelemetry.metrics`` (and names
no provider in ``OTEL_PYTHON_*_PROVIDER``) cannot have set a provider, so its
calls skip telemetry on one dictionary lookup. The spans of a call
(``_call_trace``) load with the first call that records.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any

from .._core.fork import fork_safe_lock
from .._version import __version__
from . import _names as n
from ._current_call import CURRENT

if TYPE_CHECKING:
    from opentelemetry.metrics import MeterProvider
    from opentelemetry.trace import Tracer, TracerProvider

    from .._policies.breaker.states import BreakerTransition
    from .._policies.routing.dns_name import DiscoveryChange
    from .._policies.routing.ejection_status import EjectionTransition
    from ._call_trace import CallTrace
    from ._events import CallStarted
    from ._metrics import ClientMetrics

__all__ = ["Telemetry"]

_SCOPE = "stormguard"

#: A provider named in the environment: the API builds it on its first lookup.
_PROVIDER_ENV_SET = any(
    name in os.environ for name in ("OTEL_PYTHON_TRACER_PROVIDER", "OTEL_PYTHON_METER_PROVIDER")
)


def _api_in_use() -> bool:
    """Whether a global provider may be set. Setting one takes the API's ``trace`` or
    ``metrics`` module, so while neither is imported (and the environment names no
    provider) none is, and the API need not be imported to ask."""
    return (
        _PROVIDER_ENV_SET
        or "opentelemetry.trace" in sys.modules
        or "opentelemetry.metrics" in sys.modules
    )


_API: tuple[Any, Any] | None = None


def _api() -> tuple[Any, Any]:
    """The API's ``trace`` and ``metrics`` modules, imported once (a call that asks
    for the global providers then skips the import statement)."""
    global _API
    if _API is None:
        from opentelemetry import metrics, trace

        _API = (trace, metrics)
    return _API


def _records_no_spans(provider: TracerProvider) -> bool:
    """The API's stand-ins: the proxy handed out until a provider is set, and the no-op."""
    from opentelemetry.trace import NoOpTracerProvider, ProxyTracerProvider

    return isinstance(provider, (ProxyTracerProvider, NoOpTracerProvider))


def _records_no_metrics(provider: MeterProvider) -> bool:
    """The API's stand-ins: ``NoOpMeterProvider``, and the proxy ``get_meter_provider()``
    hands out until a provider is set. The API names no public class for that proxy,
    but it ships no recording provider at all (recording is the SDK's, or a vendor's),
    so a provider whose class the API package defines records nothing."""
    from opentelemetry.metrics import NoOpMeterProvider

    if isinstance(provider, NoOpMeterProvider):
        return True
    module = type(provider).__module__
    return module == "opentelemetry.metrics" or module.startswith("opentelemetry.metrics.")


class Telemetry:
    """Spans and metrics for every call of the clients it is given to.

    >>> client = stormguard.Client(telemetry=Telemetry())  # doctest: +SKIP
    >>> client = stormguard.Client(telemetry=Telemetry(tracer_provider=provider))  # doctest: +SKIP

    ``tracer_provider`` / ``meter_provider``: None uses the global providers
    (``opentelemetry.trace.set_tracer_provider``), looked up at each call, so a
    provider configured after the client was made is used too. Prompt and
    completion text are recorded (``gen_ai.input.messages``,
    ``gen_ai.output.messages``) only with ``capture_content=True``; headers and the
    API key never are. ``provider_name`` is ``gen_ai.provider.name`` (the wire API
    is OpenAI's; say ``"vllm"`` or your own name if you prefer).
    """

    def __init__(
        self,
        *,
        capture_content: bool = False,
        tracer_provider: TracerProvider | None = None,
        meter_provider: MeterProvider | None = None,
        provider_name: str = "openai",
    ) -> None:
        self.capture_content = capture_content
        self.provider_name = provider_name
        self._tracer_provider = tracer_provider
        self._meter_provider = meter_provider
        self._tracers: tuple[TracerProvider, Tracer] | None = None
        self._metrics: tuple[MeterProvider, ClientMetrics] | None = None
        self._lock = fork_safe_lock()
        #: The (tracer, meter) providers last found to be no-ops.
        self._idle: tuple[object, object] = (None, None)

    def __repr__(self) -> str:
        return f"Telemetry(capture_content={self.capture_content})"

    # -- providers, looked up per call ---------------------------------------------------

    def tracer(self) -> Tracer | None:
        """The tracer, or None while no tracer provider is configured."""
        provider = self._tracer_provider
        if provider is None:
            if not _api_in_use():
                return None
            provider = _api()[0].get_tracer_provider()
        if _records_no_spans(provider):
            return None
        cached = self._tracers
        if cached is None or cached[0] is not provider:
            tracer = provider.get_tracer(_SCOPE, __version__, schema_url=n.SEMCONV_SCHEMA_URL)
            self._tracers = cached = (provider, tracer)
        return cached[1]

    def metrics(self) -> ClientMetrics | None:
        """The instruments, or None while no meter provider is configured."""
        provider = self._meter_provider
        if provider is None:
            if not _api_in_use():
                return None
            provider = _api()[1].get_meter_provider()
        if _records_no_metrics(provider):
            return None
        cached = self._metrics
        if cached is None or cached[0] is not provider:
            from ._metrics import ClientMetrics

            with self._lock:  # instruments (and the gauge's callback) once per provider
                cached = self._metrics
                if cached is None or cached[0] is not provider:
                    meter = provider.get_meter(_SCOPE, __version__, schema_url=n.SEMCONV_SCHEMA_URL)
                    self._metrics = cached = (provider, ClientMetrics(meter))
        return cached[1]

    # -- the Observer interface ---------------------------------------------------------

    def quiet(self) -> bool:
        """Whether a call would record nothing, known cheaply: the fast paths taken on
        every call of a program that never configured OpenTelemetry (the API not even
        imported, or the same two providers found to record nothing last time; a
        provider set later is a new object). Both go through the API's public getters
        only. The pipeline asks before it builds a call's ``CallStarted``."""
        tracer_provider = self._tracer_provider
        meter_provider = self._meter_provider
        if tracer_provider is None or meter_provider is None:
            if not _api_in_use():
                if tracer_provider is None and meter_provider is None:
                    return True
            else:
                trace, metrics = _api()
                tracer_provider = tracer_provider or trace.get_tracer_provider()
                meter_provider = meter_provider or metrics.get_meter_provider()
        return tracer_provider is self._idle[0] and meter_provider is self._idle[1]

    def start_call(self, event: CallStarted) -> CallTrace | None:
        if self.quiet():
            return None
        tracer_provider = self._tracer_provider
        meter_provider = self._meter_provider
        if (tracer_provider is None or meter_provider is None) and _api_in_use():
            trace, metrics = _api()
            tracer_provider = tracer_provider or trace.get_tracer_provider()
            meter_provider = meter_provider or metrics.get_meter_provider()
        tracer, instruments = self.tracer(), self.metrics()
        if tracer is None and instruments is None:
            self._idle = (tracer_provider, meter_provider)
            return None
        from ._call_trace import CallTrace

        return CallTrace(self, event, tracer, instruments)

    def breaker_changed(self, transition: BreakerTransition) -> None:
        state = transition.to_state.value
        instruments = self.metrics()
        if instruments is not None:
            instruments.breaker_state(transition.name, state)
            instruments.breaker_transitions.add(
                1, {n.BREAKER_NAME: transition.name, n.BREAKER_STATE: state}
            )
        call = CURRENT.get()
        if call is not None and call.recording:
            attributes: dict[str, Any] = {
                n.BREAKER_NAME: transition.name,
                n.BREAKER_FROM_STATE: transition.from_state.value,
                n.BREAKER_STATE: state,
                n.BREAKER_REASON: transition.reason,
            }
            if transition.open_for is not None:
                attributes[n.BREAKER_OPEN_FOR] = transition.open_for
            call.span.add_event(n.EVENT_BREAKER_TRANSITION, attributes)

    def endpoint_changed(self, transition: EjectionTransition) -> None:
        status = transition.to_status.value
        instruments = self.metrics()
        if instruments is not None:
            instruments.endpoint_status(transition.endpoint, status)
            instruments.endpoint_transitions.add(
                1,
                {
                    n.ATTEMPT_ENDPOINT: transition.endpoint,
                    n.ENDPOINT_STATUS: status,
                    n.ENDPOINT_REASON: transition.reason,
                },
            )
        call = CURRENT.get()
        if call is not None and call.recording:
            attributes: dict[str, Any] = {
                n.ATTEMPT_ENDPOINT: transition.endpoint,
                n.ENDPOINT_FROM_STATUS: transition.from_status.value,
                n.ENDPOINT_STATUS: status,
                n.ENDPOINT_REASON: transition.reason,
            }
            if transition.ejected_for is not None:
                attributes[n.ENDPOINT_EJECTED_FOR] = transition.ejected_for
            call.span.add_event(n.EVENT_ENDPOINT_TRANSITION, attributes)

    def endpoints_discovered(self, change: DiscoveryChange) -> None:
        """A DNS name's endpoints changed: the count now, and one more change."""
        instruments = self.metrics()
        if instruments is not None:
            instruments.discovered(change.name, len(change.endpoints))
            instruments.discovery_changes.add(1, {n.DISCOVERY_NAME: change.name})
            instruments.forget_endpoints(change.removed)  # their gauges' series end
