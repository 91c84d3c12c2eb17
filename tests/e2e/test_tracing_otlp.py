"""One trace from the caller to the engine, exported over OTLP/HTTP protobuf.

The client (``configure_otlp`` → ``Telemetry``) and the real reference server
(``--otlp-endpoint``) both export to a receiver in this test; the decoded spans
must form, per call: logical span → attempt spans → server span → admission,
engine prefill and decode spans, all in one trace.
"""

from __future__ import annotations

from collections import defaultdict

import pytest

import stormguard
from stormguard import RetryBudget, RetryPolicy
from stormguard.telemetry import Telemetry, configure_otlp
from tests.e2e.otlp_receiver import OTLPReceiver, ReceivedSpan
from tests.e2e.server_process import run_server

pytestmark = pytest.mark.e2e

CLIENT, SERVER = 3, 2  # OTLP span kinds
MESSAGES = [{"role": "user", "content": "Say hello"}]


def children(spans: list[ReceivedSpan]) -> dict[str | None, list[ReceivedSpan]]:
    tree: dict[str | None, list[ReceivedSpan]] = defaultdict(list)
    for span in spans:
        tree[span.parent_id].append(span)
    for kids in tree.values():
        kids.sort(key=lambda s: s.start_ns)
    return tree


def test_client_attempts_and_server_spans_share_one_trace(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")  # the server exports promptly too
    with OTLPReceiver() as receiver:
        # Injected 500s on the server make some calls retry; the seed fixes which.
        with run_server("--otlp-endpoint", receiver.endpoint, "--error-rate", "0.4") as server:
            setup = configure_otlp(
                receiver.endpoint, service_name="e2e-client", metric_interval_s=60, set_global=False
            )
            client = stormguard.Client(
                base_url=server.base_url,
                model="stormguard-sim",
                timeout=20,
                retry_policy=RetryPolicy(max_attempts=4, base_delay=0.01, max_delay=0.05),
                retry_budget=RetryBudget(ratio=1.0, min_retries_per_second=10),
                telemetry=Telemetry(
                    tracer_provider=setup.tracer_provider, meter_provider=setup.meter_provider
                ),
            )
            ok = 0
            for i in range(8):
                try:
                    if i % 2:
                        stream = client.chat.completions.create(
                            messages=MESSAGES, max_tokens=6, stream=True
                        )
                        list(stream)
                    else:
                        client.chat.completions.create(messages=MESSAGES, max_tokens=6)
                    ok += 1
                except stormguard.InternalServerError:
                    pass
            setup.shutdown()  # flush the client's spans and metrics
            stats = client.stats()
        # The server is stopped: its batch span processor has flushed at exit.
        assert receiver.metric_posts, "the client's metrics reached the receiver"

    spans = receiver.spans()
    tree = children(spans)
    logical = [s for s in spans if s.service == "e2e-client" and s.parent_id is None]
    assert len(logical) == 8 and ok >= 4
    assert {s.name for s in logical} == {"chat stormguard-sim"}
    retried = 0
    for call in logical:
        attempts = tree[call.span_id]
        assert attempts and all(a.kind == CLIENT and a.trace_id == call.trace_id for a in attempts)
        assert call.attributes["stormguard.attempts"] == len(attempts)
        retried += len(attempts) > 1
        for attempt in attempts:
            [request] = tree[attempt.span_id]  # the server's span for this attempt
            assert request.service == "stormguard-server" and request.kind == SERVER
            assert request.trace_id == call.trace_id
            assert request.name == "POST /v1/chat/completions"
            assert (
                request.attributes["http.response.status_code"]
                == (attempt.attributes["http.response.status_code"])
            )
            assert request.attributes["stormguard.request.attempt"] == str(
                attempt.attributes["stormguard.attempt.number"]
            )
            phases = [s.name for s in tree[request.span_id]]
            assert phases[0] == "admission" and "engine prefill" in phases
            if attempt.attributes["http.response.status_code"] == 200:
                assert phases == ["admission", "engine prefill", "engine decode"]
    assert retried >= 1, "with 40% injected errors some call was retried"
    assert stats.attempts == sum(len(tree[c.span_id]) for c in logical)
