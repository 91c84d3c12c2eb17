"""``import stormguard`` loads nothing optional; what it leaves out loads when used.

Each check runs in a fresh interpreter (this test process has long imported
everything). Nothing here is timed: bench/bench_import.py measures the time.
Also: telemetry reads only OpenTelemetry's public names, and still records
once a provider is set after the client was built.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

SDK = Path(__file__).resolve().parents[2] / "sdk" / "stormguard"

#: Loaded on first use, never by ``import stormguard``.
LAZY = (
    "tiktoken",
    "tiktoken_ext",
    "opentelemetry",
    "opentelemetry.sdk",
    "httpcore",
    "h11",
    "h2",
    "openai",
    "stormguard.tokens._policy",
    "stormguard.tokens._bpe",
    "stormguard.tokens._models",
    "stormguard.tokens._context_windows",
    "stormguard.tokens._tiktoken_counter",
    "stormguard.telemetry._call_trace",
    "stormguard.telemetry._span_attributes",
    "stormguard.telemetry._captured_content",
    "stormguard.telemetry._metrics",
    "stormguard.telemetry._otlp",
    "stormguard._io.deadline_backend",
    "stormguard._policies.routing.discovery",
    "stormguard._policies.routing.discovery_config",
    "stormguard._policies.routing.discovery_endpoints",
    "stormguard._policies.routing.discovery_wait",
    "stormguard._policies.routing.dns_name",
    # The quota shared in Redis: only with QuotaPolicy(redis_url=...), redis-py at the
    # first call.
    "redis",
    "stormguard._policies.quota._redis",
    # The async client's aiohttp backend: only with http_backend="aiohttp".
    "aiohttp",
    "stormguard._io.aiohttp_transport",
)

#: A program that only makes sync calls never loads these (asyncio costs ~15 ms).
SYNC_ONLY = ("asyncio", "importlib.metadata")


def run_child(code: str) -> dict[str, object]:
    """Run ``code`` in a fresh interpreter; it prints one JSON object last."""
    ran = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
        env={
            name: value
            for name, value in os.environ.items()
            if not name.startswith(("OTEL_", "STORMGUARD_"))
        },
    )
    assert ran.returncode == 0, ran.stderr
    result: dict[str, object] = json.loads(ran.stdout.splitlines()[-1])
    return result


def test_import_stormguard_loads_nothing_optional() -> None:
    loaded = run_child(
        f"""
        import json, sys
        import stormguard
        from stormguard import Client, AsyncClient, Telemetry, DeadlineTransport
        loaded = [m for m in {LAZY!r} if m in sys.modules]
        from stormguard.tokens import TokenPolicy
        policy = TokenPolicy()
        print(json.dumps({{"loaded": loaded, "tiktoken": "tiktoken" in sys.modules}}))
        """
    )
    assert loaded == {"loaded": [], "tiktoken": False}


def test_a_client_without_precheck_or_provider_calls_without_loading_them() -> None:
    loaded = run_child(
        f"""
        import json, sys
        import httpx
        import stormguard

        def answer(request):
            return httpx.Response(200, json={{
                "id": "c", "object": "chat.completion", "created": 1, "model": "m",
                "choices": [{{"index": 0, "finish_reason": "stop",
                             "message": {{"role": "assistant", "content": "hi"}}}}],
            }})

        http = httpx.Client(transport=httpx.MockTransport(answer))
        client = stormguard.Client(base_url="http://llm.test/v1", api_key="k", model="m",
                                   http_client=http)
        text = client.chat.completions.create(messages=[{{"role": "user", "content": "x"}}])
        lazy = {LAZY + SYNC_ONLY!r}
        print(json.dumps({{
            "text": text.choices[0].message.content,
            "loaded": [m for m in lazy if m in sys.modules],
        }}))
        """
    )
    assert loaded == {"text": "hi", "loaded": []}


def test_a_precheck_loads_tiktoken_and_the_tables_when_it_runs() -> None:
    result = run_child(
        """
        import json, sys
        import stormguard
        from stormguard.tokens import TokenPolicy

        before = "tiktoken" in sys.modules
        client = stormguard.Client(
            base_url="http://llm.test/v1", api_key="k", model="gpt-4o",
            token_policy=TokenPolicy(server_context_windows=False, server_tokenize=False),
        )
        try:
            client.chat.completions.create(
                messages=[{"role": "user", "content": "word " * 200_000}], max_tokens=10
            )
        except stormguard.ContextWindowExceededError as exc:
            refused = {"counter": exc.counter, "window": exc.context_window}
        print(json.dumps({
            "before": before,
            "refused": refused,
            "tiktoken": "tiktoken" in sys.modules,
            "table": "stormguard.tokens._context_windows" in sys.modules,
        }))
        """
    )
    assert result == {
        "before": False,
        "refused": {"counter": "tiktoken:o200k_base", "window": 128_000},
        "tiktoken": True,
        "table": True,
    }


def test_spans_and_metrics_appear_once_providers_are_set_after_the_client_was_built() -> None:
    result = run_child(
        """
        import json, sys
        import httpx
        import stormguard

        seen = []

        def answer(request):
            seen.append(request.headers.get("traceparent"))
            return httpx.Response(200, json={
                "id": "c", "object": "chat.completion", "created": 1, "model": "m",
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": "hi"}}],
            })

        http = httpx.Client(transport=httpx.MockTransport(answer))
        client = stormguard.Client(base_url="http://llm.test/v1", api_key="k", model="m",
                                   http_client=http)

        def call():
            client.chat.completions.create(messages=[{"role": "user", "content": "x"}])

        call()
        api_loaded = "opentelemetry.trace" in sys.modules

        # The API imported, no provider set yet: still nothing recorded.
        from opentelemetry import metrics, trace
        call()

        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
            InMemorySpanExporter,
        )

        reader = InMemoryMetricReader()
        metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
        call()  # metrics only

        def calls_counted():
            data = reader.get_metrics_data()
            return sum(
                point.value
                for resource in data.resource_metrics
                for scope in resource.scope_metrics
                for metric in scope.metrics
                if metric.name == "stormguard.client.calls"
                for point in metric.data.data_points
            )

        exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        trace.set_tracer_provider(provider)
        call()  # spans too

        spans = exporter.get_finished_spans()
        print(json.dumps({
            "api_loaded_by_first_call": api_loaded,
            "traceparent_sent": [value is not None for value in seen],
            "spans": sorted(span.name for span in spans),
            "attempt_parent_is_call": spans[0].parent.span_id == spans[1].context.span_id
            if spans[0].name.startswith("POST") else None,
            "calls_counted": calls_counted(),
        }))
        """
    )
    assert result == {
        "api_loaded_by_first_call": False,
        "traceparent_sent": [False, False, False, True],
        "spans": ["POST /v1/chat/completions", "chat m"],
        "attempt_parent_is_call": True,
        "calls_counted": 2,
    }


def _otel_private_reads(path: Path) -> list[str]:
    """Every private OpenTelemetry name ``path`` reads: ``from opentelemetry.x import _y``,
    a module path with a private part (``opentelemetry.metrics._internal``), and
    ``module._name`` or ``getattr(module, "_name")`` on a name bound to an
    OpenTelemetry module."""
    tree = ast.parse(path.read_text(), str(path))
    modules: set[str] = set()
    found: list[str] = []

    def private_path(dotted: str) -> bool:
        return any(part.startswith("_") for part in dotted.split("."))

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("opentelemetry"):
                    if private_path(alias.name):
                        found.append(alias.name)
                    modules.add(alias.asname or alias.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("opentelemetry"):
            module = node.module or ""
            if private_path(module):
                found.append(module)
            for alias in node.names:
                if alias.name.startswith("_"):
                    found.append(f"{module}.{alias.name}")
                modules.add(alias.asname or alias.name)
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in modules
            and node.attr.startswith("_")
        ):
            found.append(f"{node.value.id}.{node.attr}")
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "hasattr")
            and len(node.args) >= 2
            and isinstance(node.args[0], ast.Name)
            and node.args[0].id in modules
            and isinstance(node.args[1], ast.Constant)
            and str(node.args[1].value).startswith("_")
        ):
            found.append(f"{node.func.id}({node.args[0].id}, {node.args[1].value!r})")
    return found


def test_the_sdk_reads_no_private_opentelemetry_name() -> None:
    found = {
        str(path.relative_to(SDK)): reads
        for path in sorted(SDK.rglob("*.py"))
        if (reads := _otel_private_reads(path))
    }
    assert found == {}


def test_the_private_name_check_finds_what_it_looks_for(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        "from opentelemetry import trace\n"
        "from opentelemetry.context import _SUPPRESS_HTTP_INSTRUMENTATION_KEY\n"
        "from opentelemetry.metrics._internal import MeterProvider\n"
        "import opentelemetry.metrics as m\n"
        "trace._TRACER_PROVIDER\n"
        "getattr(m, '_METER_PROVIDER', None)\n"
        "trace.get_tracer_provider()\n"
    )
    assert _otel_private_reads(sample) == [
        "opentelemetry.context._SUPPRESS_HTTP_INSTRUMENTATION_KEY",
        "opentelemetry.metrics._internal",
        "trace._TRACER_PROVIDER",
        "getattr(m, '_METER_PROVIDER')",
    ]
