"""STORMGUARD_LOG, openai's OPENAI_LOG style: one INFO line per retry, failover and
requeue, naming the attempt, the reason and the wait, and never a secret."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
import respx

import stormguard
from stormguard._core import logs as _logs
from tests.sdk.helpers import MESSAGES, Api, chat_json

KEY = "sk-test-secret-key"


@pytest.fixture
def restore_level() -> Iterator[None]:
    level = _logs.logger.level
    yield
    _logs.logger.setLevel(level)


@pytest.mark.parametrize(("value", "level"), [("info", logging.INFO), ("DEBUG", logging.DEBUG)])
def test_stormguard_log_sets_the_level(
    monkeypatch: pytest.MonkeyPatch, restore_level: None, value: str, level: int
) -> None:
    _logs.logger.setLevel(logging.NOTSET)
    monkeypatch.setenv("STORMGUARD_LOG", value)
    _logs.setup_logging()
    assert _logs.logger.level == level


def test_unknown_or_missing_stormguard_log_changes_nothing(
    monkeypatch: pytest.MonkeyPatch, restore_level: None
) -> None:
    _logs.logger.setLevel(logging.WARNING)
    monkeypatch.setenv("STORMGUARD_LOG", "verbose")
    _logs.setup_logging()
    monkeypatch.delenv("STORMGUARD_LOG")
    _logs.setup_logging()
    assert _logs.logger.level == logging.WARNING


async def test_one_info_line_per_retry_without_the_echoed_key(
    api: Api, mock: respx.MockRouter, caplog: pytest.LogCaptureFixture
) -> None:
    echoed = {"error": {"message": f"overloaded, Authorization: Bearer {KEY}"}}
    mock.post("/chat/completions").side_effect = [
        respx.MockResponse(500, json=echoed),
        respx.MockResponse(503, json=echoed, headers={"retry-after": "2"}),
        respx.MockResponse(200, json=chat_json()),
    ]
    client = api.client(api_key=KEY, concurrency=None)
    with caplog.at_level(logging.INFO, logger="stormguard"):
        resp = await api.run(client.chat.completions.create(messages=MESSAGES))
    assert resp.attempts == 3
    lines = [r for r in caplog.records if r.name.startswith("stormguard")]
    assert [r.levelno for r in lines] == [logging.INFO, logging.INFO]
    first, second = (r.getMessage() for r in lines)
    assert first.startswith(
        "POST /chat/completions at llm.test:80 attempt 1 failed (InternalServerError 500"
    )
    assert "retrying in " in first
    assert second.startswith("POST /chat/completions at llm.test:80 attempt 2 failed (")
    assert "503" in second and second.endswith("retrying in 2.000 s")
    assert all("[redacted]" in line for line in (first, second))
    assert KEY not in caplog.text


async def test_debug_line_when_retrying_stops(
    api: Api, mock: respx.MockRouter, caplog: pytest.LogCaptureFixture
) -> None:
    mock.post("/chat/completions").respond(400, json={"error": {"message": f"bad {KEY}"}})
    client = api.client(api_key=KEY)
    with (
        caplog.at_level(logging.DEBUG, logger="stormguard"),
        pytest.raises(stormguard.BadRequestError),
    ):
        await api.run(client.chat.completions.create(messages=MESSAGES))
    lines = [r.getMessage() for r in caplog.records if r.name.startswith("stormguard")]
    assert lines == [
        f"not retrying after attempt 1 (BadRequestError 400: {lines[0].split(': ', 1)[1]}"
    ]
    assert lines[0].endswith(": not_retryable")
    assert KEY not in caplog.text and "[redacted]" in caplog.text


async def test_nothing_logged_at_warning(
    api: Api, mock: respx.MockRouter, caplog: pytest.LogCaptureFixture
) -> None:
    mock.post("/chat/completions").side_effect = [
        respx.MockResponse(500, json={"error": {"message": "x"}}),
        respx.MockResponse(200, json=chat_json()),
    ]
    client = api.client()
    with caplog.at_level(logging.WARNING, logger="stormguard"):
        await api.run(client.chat.completions.create(messages=MESSAGES))
    assert not [r for r in caplog.records if r.name.startswith("stormguard")]


async def test_requeue_has_its_own_line(
    api: Api, mock: respx.MockRouter, caplog: pytest.LogCaptureFixture
) -> None:
    mock.post("/chat/completions").side_effect = [
        respx.MockResponse(
            503, json={"error": {"message": "shed"}}, headers={"x-load-shed": "queue_full"}
        ),
        respx.MockResponse(200, json=chat_json()),
    ]
    client = api.client()
    with caplog.at_level(logging.INFO, logger="stormguard"):
        await api.run(client.chat.completions.create(messages=MESSAGES))
    lines = [r.getMessage() for r in caplog.records if r.name.startswith("stormguard")]
    assert len(lines) == 1
    assert "attempt 1 failed (ServiceUnavailableError 503" in lines[0]
    assert "requeued locally, next attempt in " in lines[0]


async def test_failover_has_its_own_line(api: Api, caplog: pytest.LogCaptureFixture) -> None:
    other = "http://llm2.test/v1"
    with respx.mock(assert_all_called=False) as router:
        router.post(f"{other}/chat/completions").respond(200, json=chat_json())
        router.post("http://llm.test/v1/chat/completions").respond(
            500, json={"error": {"message": "boom"}}
        )
        two = api.client(base_url=["http://llm.test/v1", other], concurrency=None)
        two._core.rng.seed(7)  # the same picks every run: no run without a failover
        with caplog.at_level(logging.INFO, logger="stormguard"):
            for _ in range(6):
                await api.run(two.chat.completions.create(messages=MESSAGES))
    lines = [r.getMessage() for r in caplog.records if r.name.startswith("stormguard")]
    assert len(lines) >= 2
    assert all(
        line.startswith("POST /chat/completions at llm.test:80 attempt 1 failed")
        and "failing over to another endpoint in " in line
        for line in lines
    )
