"""One call to export traces and metrics over OTLP/HTTP (extra ``otlp``).

The SDK itself needs only opentelemetry-api; this helper is for programs that
want the usual setup without writing it: a tracer provider with a batch span
processor and a meter provider with a periodic reader, both exporting
OTLP/HTTP protobuf to a collector or to Jaeger (port 4318).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.trace import TracerProvider

__all__ = ["OTLPSetup", "configure_otlp"]

DEFAULT_ENDPOINT = "http://localhost:4318"


@dataclass(frozen=True)
class OTLPSetup:
    """The providers ``configure_otlp`` made; ``shutdown()`` flushes and stops them."""

    tracer_provider: TracerProvider
    meter_provider: MeterProvider | None

    def force_flush(self, timeout_millis: int = 10_000) -> None:
        self.tracer_provider.force_flush(timeout_millis)
        if self.meter_provider is not None:
            self.meter_provider.force_flush(timeout_millis)

    def shutdown(self) -> None:
        """Export what is buffered, then stop (call at exit: batches are otherwise lost)."""
        self.tracer_provider.shutdown()
        if self.meter_provider is not None:
            self.meter_provider.shutdown()


def configure_otlp(
    endpoint: str | None = None,
    *,
    service_name: str = "stormguard-client",
    metrics: bool = True,
    metric_interval_s: float = 10.0,
    set_global: bool = True,
) -> OTLPSetup:
    """Export spans (and metrics) over OTLP/HTTP protobuf to ``endpoint``.

    >>> setup = configure_otlp("http://localhost:4318", service_name="my-app")  # doctest: +SKIP
    >>> # stormguard.Client calls are now traced, until:
    >>> setup.shutdown()  # doctest: +SKIP

    ``endpoint`` is the collector's base URL (``/v1/traces`` and ``/v1/metrics``
    are appended); None reads ``OTEL_EXPORTER_OTLP_ENDPOINT`` and then uses
    ``http://localhost:4318``. ``set_global=False`` leaves the global providers
    alone: pass the returned ones to ``Telemetry(tracer_provider=...)``.
    """
    try:
        from opentelemetry import metrics as otel_metrics
        from opentelemetry import trace
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(
            "configure_otlp needs the OpenTelemetry SDK and OTLP exporter: "
            "pip install 'stormguard[otlp]'"
        ) from exc
    import os

    base = (endpoint or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or DEFAULT_ENDPOINT).rstrip(
        "/"
    )
    resource = Resource.create({"service.name": service_name})
    tracer_provider = TracerProvider(resource=resource)
    tracer_provider.add_span_processor(
        BatchSpanProcessor(OTLPSpanExporter(endpoint=f"{base}/v1/traces"))
    )
    meter_provider = None
    if metrics:
        reader = PeriodicExportingMetricReader(
            OTLPMetricExporter(endpoint=f"{base}/v1/metrics"),
            export_interval_millis=metric_interval_s * 1000,
        )
        meter_provider = MeterProvider(resource=resource, metric_readers=[reader])
    if set_global:
        trace.set_tracer_provider(tracer_provider)
        if meter_provider is not None:
            otel_metrics.set_meter_provider(meter_provider)
    return OTLPSetup(tracer_provider, meter_provider)
