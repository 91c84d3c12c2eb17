"""Traces of a small retry storm, from the caller down to the engine.

Starts a reference server that exports its own spans (``--otlp-endpoint``) and
fails 30% of requests with an injected 500, then makes a few calls with
stormguard exporting to the same collector (``configure_otlp``). Each call's
trace shows its logical span, one span per attempt (with the backoff before
it and the load headers it got), and under each attempt the server's
admission wait and engine prefill/decode. Prints each call's trace id.

    docker compose -f examples/jaeger-compose.yaml up -d   # Jaeger on :4318, UI on :16686
    python examples/tracing.py                             # then open http://localhost:16686
    python examples/tracing.py --otlp-endpoint http://collector:4318
"""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys
import time

import httpx
from opentelemetry import trace

import stormguard
from stormguard import RetryBudget, RetryPolicy
from stormguard.telemetry import configure_otlp


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_server(port: int, otlp_endpoint: str) -> subprocess.Popen[bytes]:
    server = subprocess.Popen(
        [
            sys.executable, "-m", "stormguard_server", "--port", str(port),
            "--log-level", "warning", "--otlp-endpoint", otlp_endpoint, "--error-rate", "0.3",
        ]
    )  # fmt: skip
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/ready", timeout=1).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    server.terminate()
    raise SystemExit("the reference server did not become ready")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--otlp-endpoint", default="http://localhost:4318")
    parser.add_argument("--calls", type=int, default=8)
    args = parser.parse_args()

    port = free_port()
    server = start_server(port, args.otlp_endpoint)
    setup = configure_otlp(args.otlp_endpoint, service_name="tracing-example")
    tracer = trace.get_tracer("examples.tracing")
    client = stormguard.Client(
        base_url=f"http://127.0.0.1:{port}/v1",
        model="stormguard-sim",
        timeout=20,
        retry_policy=RetryPolicy(max_attempts=3, base_delay=0.05),
        # A small budget, as in production: once it is spent, calls fail instead of retrying.
        retry_budget=RetryBudget(ratio=0.2, min_retries_per_second=0.2),
    )
    try:
        for i in range(args.calls):
            with tracer.start_as_current_span(f"example request {i + 1}") as span:
                trace_id = f"{span.get_span_context().trace_id:032x}"
                try:
                    if i % 2:
                        chunks = client.chat.completions.create(
                            messages=[{"role": "user", "content": f"Count to {i}"}],
                            max_tokens=12,
                            stream=True,
                        )
                        text = "".join(c.choices[0].delta.content or "" for c in chunks)
                        outcome = f"stream of {len(text.split())} words after"
                        outcome += f" {chunks.attempts} attempt(s)"
                    else:
                        resp = client.chat.completions.create(
                            messages=[{"role": "user", "content": f"Say hello {i}"}],
                            max_tokens=12,
                        )
                        outcome = f"ok after {resp.attempts} attempt(s)"
                except stormguard.StormguardError as exc:
                    outcome = f"{type(exc).__name__} after {exc.attempts} attempt(s),"
                    outcome += f" stopped by {exc.retry_stopped_by}"
            print(f"call {i + 1}: trace {trace_id}: {outcome}")
        stats = client.stats()
        print(
            f"stormguard: {stats.logical_calls} calls, {stats.attempts} attempts,"
            f" amplification {stats.retry_amplification:.2f}"
        )
    finally:
        client.close()
        setup.shutdown()  # export what is still buffered
        server.terminate()  # SIGTERM: the server flushes its spans as it stops
        server.wait(timeout=10)
    print(f"traces exported to {args.otlp_endpoint}")


if __name__ == "__main__":
    main()
