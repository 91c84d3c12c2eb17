"""The server's metrics live in registries of their own and change nothing else in the
process: loaded inside vLLM as middleware, the admission layer must leave vLLM's
series (its ``*_created`` ones included) as they are."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import httpx

# Imports the server's metrics and the vLLM middleware into a process whose default
# registry holds a counter of its own, then prints that registry's exposition.
_PROBE = textwrap.dedent(
    """
    from prometheus_client import REGISTRY, Counter, generate_latest
    requests = Counter("host_requests", "Requests of the host application.")
    requests.inc()
    import stormguard_server.telemetry.metrics
    import stormguard_server.vllm.middleware
    import stormguard_server.app
    stormguard_server.app.create_app
    print(generate_latest(REGISTRY).decode())
    """
)


def test_loading_the_server_leaves_other_registries_untouched() -> None:
    ran = subprocess.run(
        [sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=120
    )
    assert ran.returncode == 0, ran.stderr
    assert "host_requests_total 1.0" in ran.stdout
    assert "host_requests_created" in ran.stdout


async def test_the_servers_own_exposition_has_no_created_series(
    client: httpx.AsyncClient,
) -> None:
    """The server's registry drops its ``*_created`` samples itself."""
    answer = await client.post(
        "/v1/chat/completions",
        json={
            "model": "stormguard-sim",
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 2,
        },
    )
    assert answer.status_code == 200
    text = (await client.get("/metrics")).text
    assert 'stormguard_responses_total{route="/v1/chat/completions",status="200"} 1.0' in text
    assert "stormguard_responses_created" not in text
    assert "_created" not in text
