"""openai-python's calling conventions on Client and AsyncClient (respx, both modes):
timeouts as numbers or httpx.Timeout, max_retries, NOT_GIVEN/omit, extra_query,
default_query, organization/project, connection limits and with_options."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import MappingProxyType
from typing import Any

import httpx
import httpx2
import openai
import pytest
import respx

import stormguard
from stormguard import RetryPolicy
from tests.sdk.helpers import MESSAGES, Api, chat_json, own_pools


def sent_timeout(route: respx.Route) -> dict[str, float | None]:
    timeout: dict[str, float | None] = route.calls.last.request.extensions["timeout"]
    return timeout


# -- timeout ----------------------------------------------------------------------------


async def test_timeout_number_is_the_total(api: Api, mock: respx.MockRouter) -> None:
    route = mock.post("/chat/completions").respond(200, json=chat_json())
    client = api.client(timeout=30)
    await api.run(client.chat.completions.create(messages=MESSAGES))
    assert route.calls.last.request.headers["x-request-deadline-ms"] == "30000"
    assert sent_timeout(route) == {"connect": 10.0, "read": 30.0, "write": 30.0, "pool": 30.0}
    await api.run(client.chat.completions.create(messages=MESSAGES, timeout=4.5))
    assert route.calls.last.request.headers["x-request-deadline-ms"] == "4500"
    assert sent_timeout(route) == {"connect": 4.5, "read": 4.5, "write": 4.5, "pool": 4.5}


@pytest.mark.parametrize("timeout_type", [httpx.Timeout, httpx2.Timeout, openai.Timeout])
async def test_timeout_object_read_is_total_and_parts_bound_each_attempt(
    api: Api, mock: respx.MockRouter, timeout_type: type[httpx.Timeout]
) -> None:
    route = mock.post("/chat/completions").respond(200, json=chat_json())
    client = api.client(timeout=timeout_type(10, connect=2, write=3))
    assert client.timeout == 10.0
    await api.run(client.chat.completions.create(messages=MESSAGES))
    assert route.calls.last.request.headers["x-request-deadline-ms"] == "10000"
    assert sent_timeout(route) == {"connect": 2.0, "read": 10.0, "write": 3.0, "pool": 10.0}
    # Per call: its own parts, cut to what is left of its total.
    await api.run(
        client.chat.completions.create(messages=MESSAGES, timeout=timeout_type(1.5, connect=5))
    )
    assert route.calls.last.request.headers["x-request-deadline-ms"] == "1500"
    assert sent_timeout(route) == {"connect": 1.5, "read": 1.5, "write": 1.5, "pool": 1.5}


async def test_timeout_object_without_read_means_no_total(api: Api, mock: respx.MockRouter) -> None:
    route = mock.post("/chat/completions").respond(200, json=chat_json())
    client = api.client()
    timeout = httpx.Timeout(None, connect=3)
    await api.run(client.chat.completions.create(messages=MESSAGES, timeout=timeout))
    assert "x-request-deadline-ms" not in route.calls.last.request.headers
    assert sent_timeout(route) == {"connect": 3.0, "read": None, "write": None, "pool": None}


def test_timeout_errors_are_clear() -> None:
    with pytest.raises(ValueError, match=r"connect_timeout and an httpx\.Timeout"):
        stormguard.Client(base_url="http://x.test/v1", timeout=httpx.Timeout(5), connect_timeout=1)
    with pytest.raises(ValueError, match=r"timeout\.connect must be positive"):
        stormguard.Client(base_url="http://x.test/v1", timeout=httpx.Timeout(5, connect=-1))
    with pytest.raises(TypeError, match=r"number of seconds, an httpx\.Timeout or None"):
        stormguard.Client(base_url="http://x.test/v1", timeout="10")  # type: ignore[arg-type]


# -- max_retries ------------------------------------------------------------------------


async def test_max_retries_is_max_attempts_minus_one(api: Api, mock: respx.MockRouter) -> None:
    route = mock.post("/chat/completions").respond(500, json={"error": {"message": "boom"}})
    client = api.client(max_retries=1)
    assert client.max_retries == 1
    with pytest.raises(stormguard.InternalServerError) as caught:
        await api.run(client.chat.completions.create(messages=MESSAGES))
    assert route.call_count == 2
    assert caught.value.retry_stopped_by == "max_attempts"
    route.reset()
    with pytest.raises(stormguard.InternalServerError):
        await api.run(client.with_options(max_retries=0).chat.completions.create(messages=MESSAGES))
    assert route.call_count == 1


def test_max_retries_with_retry_policy_or_bad_value_is_an_error() -> None:
    with pytest.raises(TypeError, match="max_retries or retry_policy, not both"):
        stormguard.Client(
            base_url="http://x.test/v1", max_retries=2, retry_policy=RetryPolicy(max_attempts=2)
        )
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="max_retries must be a whole number"):
            stormguard.Client(base_url="http://x.test/v1", max_retries=bad)  # type: ignore[arg-type]


def test_max_retries_in_with_options_keeps_the_other_policy_settings() -> None:
    client = stormguard.Client(
        base_url="http://x.test/v1", retry_policy=RetryPolicy(max_attempts=5, max_delay=2.0)
    )
    derived = client.with_options(max_retries=3)
    assert derived._core.retry_policy == RetryPolicy(max_attempts=4, max_delay=2.0)
    assert client._core.retry_policy.max_attempts == 5
    client.close()


# -- NOT_GIVEN and omit -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("not_given", "omitted"),
    [(stormguard.NOT_GIVEN, stormguard.omit), (openai.NOT_GIVEN, openai.omit)],
    ids=["stormguard", "openai"],
)
async def test_not_given_and_omit_are_left_out(
    api: Api, mock: respx.MockRouter, not_given: object, omitted: object
) -> None:
    route = mock.post("/chat/completions").respond(200, json=chat_json())
    client = api.client()
    await api.run(
        client.chat.completions.create(
            messages=[{"role": "user", "content": "hi", "name": omitted}],
            model=not_given,
            stream=not_given,
            temperature=not_given,
            top_p=omitted,
            max_tokens=5,
            response_format={"type": "json_object", "schema": not_given},
            timeout=not_given,
            extra_body={"seed": omitted},
            extra_query={"q": omitted},
            extra_headers={"x-trace": omitted},
        )
    )
    sent = route.calls.last.request
    assert json.loads(sent.content) == {
        "model": "m",
        "messages": MESSAGES,
        "max_tokens": 5,
        "response_format": {"type": "json_object"},
    }
    assert sent.url.query == b""
    assert "x-trace" not in sent.headers
    assert sent.headers["x-request-deadline-ms"] == "120000"


async def test_omitted_values_are_left_out_of_tuples_mappings_and_list_subclasses(
    api: Api, mock: respx.MockRouter
) -> None:
    class Messages(list[Any]):
        pass

    route = mock.post("/chat/completions").respond(200, json=chat_json())
    client = api.client()
    message = MappingProxyType({"role": "user", "content": "hi", "name": stormguard.omit})
    for messages in ((message,), Messages([message]), [message]):
        await api.run(client.chat.completions.create(messages=messages))
        assert json.loads(route.calls.last.request.content)["messages"] == MESSAGES


def test_stormguard_never_imports_openai() -> None:
    code = "import sys, stormguard; print('openai' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# -- extra_query and default_query ----------------------------------------------------------


async def test_extra_query_and_default_query_go_in_the_url(
    api: Api, mock: respx.MockRouter
) -> None:
    chat = mock.post("/chat/completions").respond(200, json=chat_json())
    models = mock.get("/models").respond(200, json={"object": "list", "data": []})
    client = api.client(default_query={"api-version": "2024-06-01", "tenant": "a"})
    assert client.default_query == {"api-version": "2024-06-01", "tenant": "a"}
    await api.run(
        client.chat.completions.create(
            messages=MESSAGES, extra_query={"tenant": "b", "tag": ["x", "y"], "empty": None}
        )
    )
    sent = chat.calls.last.request
    assert sent.url.params.multi_items() == [
        ("api-version", "2024-06-01"),
        ("tenant", "b"),
        ("tag", "x"),
        ("tag", "y"),
        ("empty", ""),
    ]
    assert json.loads(sent.content) == {"model": "m", "messages": MESSAGES}
    await api.run(client.models.list(extra_query={"page": 2}))
    assert models.calls.last.request.url.params.multi_items() == [
        ("api-version", "2024-06-01"),
        ("tenant", "a"),
        ("page", "2"),
    ]


async def test_completions_take_extra_query(api: Api, mock: respx.MockRouter) -> None:
    route = mock.post("/completions").respond(
        200, json={"id": "c", "object": "text_completion", "choices": [{"index": 0, "text": "k"}]}
    )
    client = api.client()
    await api.run(client.completions.create(prompt="p", extra_query={"a": 1}))
    assert route.calls.last.request.url.params["a"] == "1"
    assert json.loads(route.calls.last.request.content) == {"model": "m", "prompt": "p"}


# -- organization and project --------------------------------------------------------------


async def test_organization_and_project_from_arguments_or_environment(
    api: Api, mock: respx.MockRouter, monkeypatch: pytest.MonkeyPatch
) -> None:
    route = mock.post("/chat/completions").respond(200, json=chat_json())
    monkeypatch.setenv("OPENAI_ORG_ID", "org-env")
    monkeypatch.setenv("OPENAI_PROJECT_ID", "proj-env")
    from_env = api.client()
    assert (from_env.organization, from_env.project) == ("org-env", "proj-env")
    await api.run(from_env.chat.completions.create(messages=MESSAGES))
    sent = route.calls.last.request
    assert sent.headers["openai-organization"] == "org-env"
    assert sent.headers["openai-project"] == "proj-env"
    given = api.client(organization="org-1", project="proj-1")
    await api.run(given.chat.completions.create(messages=MESSAGES))
    sent = route.calls.last.request
    assert sent.headers["openai-organization"] == "org-1"
    assert sent.headers["openai-project"] == "proj-1"
    monkeypatch.delenv("OPENAI_ORG_ID")
    monkeypatch.delenv("OPENAI_PROJECT_ID")
    await api.run(api.client().chat.completions.create(messages=MESSAGES))
    sent = route.calls.last.request
    assert "openai-organization" not in sent.headers
    assert "openai-project" not in sent.headers


# -- connection limits ----------------------------------------------------------------------


def _pool_limits(client: stormguard.Client | stormguard.AsyncClient) -> tuple[int, int]:
    """The limits of the client's own pool, summed over its shards (``_io/pool_shards.py``)."""
    connections = idle = 0
    for shard in own_pools(client):
        if isinstance(client, stormguard.Client):
            assert isinstance(shard, stormguard.DeadlineTransport)  # kept underneath
        pool: Any = getattr(shard, "_pool")  # noqa: B009 (private, on purpose)
        connections += pool._max_connections
        idle += pool._max_keepalive_connections
    return connections, idle


async def test_connection_limits_default_and_configurable() -> None:
    for cls in (stormguard.Client, stormguard.AsyncClient):
        client = cls(base_url="http://x.test/v1")
        assert _pool_limits(client) == (1000, 100)
        limits = httpx.Limits(max_connections=7, max_keepalive_connections=3)
        small = cls(base_url="http://x.test/v1", connection_limits=limits)
        assert _pool_limits(small) == (7, 3)
        own: Any = httpx.Client() if cls is stormguard.Client else httpx.AsyncClient()
        with pytest.raises(TypeError, match="set limits on it instead"):
            cls(base_url="http://x.test/v1", http_client=own, connection_limits=limits)
        for each in (client, small):
            if isinstance(each, stormguard.Client):
                each.close()
            else:
                await each.close()
    assert (
        httpx.Limits(max_connections=1000, max_keepalive_connections=100)
        == stormguard.DEFAULT_CONNECTION_LIMITS
    )


# -- with_options ---------------------------------------------------------------------------


async def test_with_options_shares_pool_and_resilience_state(
    api: Api, mock: respx.MockRouter
) -> None:
    route = mock.post("/chat/completions").respond(200, json=chat_json())
    client = api.client(default_headers={"x-team": "a"}, default_query={"v": "1"})
    derived = client.with_options(
        timeout=5,
        default_headers={"x-env": "test"},
        default_query={"w": "2"},
        organization="org-2",
        model="m2",
    )
    assert type(derived) is type(client)
    assert client.copy is not None and type(client).copy is type(client).with_options
    assert derived._http is client._http
    assert derived.retry_budget is client.retry_budget
    assert derived.concurrency is client.concurrency
    assert derived._core.breakers is client._core.breakers
    assert derived._core.ejection is client._core.ejection
    assert derived._core.picker is client._core.picker
    assert derived.chat.completions._client is derived
    await api.run(derived.chat.completions.create(messages=MESSAGES))
    sent = route.calls.last.request
    assert sent.headers["x-request-deadline-ms"] == "5000"
    assert sent.headers["x-team"] == "a"
    assert sent.headers["x-env"] == "test"
    assert sent.headers["openai-organization"] == "org-2"
    assert sent.url.params.multi_items() == [("v", "1"), ("w", "2")]
    assert json.loads(sent.content)["model"] == "m2"
    # The parent is unchanged, and counts the derived client's call in its stats.
    await api.run(client.chat.completions.create(messages=MESSAGES))
    sent = route.calls.last.request
    assert sent.headers["x-request-deadline-ms"] == "120000"
    assert "x-env" not in sent.headers and "openai-organization" not in sent.headers
    assert json.loads(sent.content)["model"] == "m"
    assert client.stats().logical_calls == 2
    # Closing the derived client leaves the shared pool open.
    await api.run(derived.close())
    assert not client._http.is_closed


async def test_with_options_timeout_object_and_refused_options(api: Api) -> None:
    client = api.client(connect_timeout=1)
    derived = client.with_options(timeout=httpx.Timeout(8, connect=2))
    assert derived._core.attempt_timeouts.connect == 2
    assert derived.with_options(timeout=3)._core.attempt_timeouts.connect == 2
    assert client._core.attempt_timeouts.connect == 1
    with pytest.raises(TypeError, match="with_options cannot change base_url"):
        client.with_options(base_url="http://other.test/v1")
    with pytest.raises(TypeError, match="max_retries or retry_policy"):
        client.with_options(max_retries=1, retry_policy=RetryPolicy())


# -- typing ---------------------------------------------------------------------------------


def test_mypy_strict_accepts_openai_style_calls() -> None:
    from mypy import api as mypy_api

    sample = Path(__file__).with_name("openai_style_typing.py")
    out, err, status = mypy_api.run(["--strict", "--no-error-summary", str(sample)])
    assert status == 0, out + err
