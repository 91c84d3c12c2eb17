"""openai-python over ``stormguard.httpx_client`` with two providers, against two
reference servers on 127.0.0.1: each serves the model under its own name; while
the primary fails every request, every call succeeds on the secondary, and once
it serves again calls return to it."""

from __future__ import annotations

import time

import pytest

import stormguard
from stormguard import Deployment, EjectionConfig
from tests.e2e.conftest import ServerFactory, spec

pytestmark = pytest.mark.e2e

MESSAGES = [{"role": "user", "content": "hi"}]


def test_openai_python_fails_over_to_the_secondary_and_returns(
    stormguard_server_factory: ServerFactory,
) -> None:
    openai = pytest.importorskip("openai")
    primary, secondary = stormguard_server_factory.together(
        spec("--model", "gpt-4.1", admin=True), spec("--model", "prod-gpt41")
    )
    http_client = stormguard.httpx_client(
        base_url=[
            Deployment(
                primary.base_url,
                name="primary",
                models={"chat-large": "gpt-4.1"},
                api_key="sk-primary-e2e-0123456789",
            ),
            Deployment(
                secondary.base_url,
                name="secondary",
                tier=2,
                models={"chat-large": "prod-gpt41"},
                api_key="secondary-e2e-0123456789",
                api_key_header="api-key",
            ),
        ],
        timeout=10,
        ejection=EjectionConfig(base_ejection_time=2.0),
    )
    with openai.OpenAI(
        base_url=primary.base_url, api_key="unused", http_client=http_client, max_retries=0
    ) as client:

        def call() -> tuple[str, str]:
            raw = client.chat.completions.with_raw_response.create(
                model="chat-large", messages=MESSAGES, max_tokens=4
            )
            info = raw.http_response.extensions["stormguard"]
            return info.deployment, raw.parse().model

        assert call() == ("primary", "gpt-4.1")
        primary.admin_post("/admin/faults", {"error_rate": 1.0})
        during = [call() for _ in range(10)]
        assert during == [("secondary", "prod-gpt41")] * 10
        # Five failures in a row took it out: the later calls did not try it (one more
        # if a slow machine let its 2 s ejection end: a probation call, failed).
        assert 5 <= primary.metric("stormguard_engine_injected_errors_total") < 10
        primary.admin_post("/admin/faults", {"error_rate": 0.0})
        deadline = time.monotonic() + 20
        while (served := call())[0] != "primary":  # back after its ejection time
            assert time.monotonic() < deadline, "the primary never served again"
            time.sleep(0.05)
        assert served == ("primary", "gpt-4.1")
