"""Fallback by why a model refused a call: a request too long for it (refused by the
token pre-check before anything is sent, or by the server's 400) goes to a
longer-context model; a content filter's refusal goes nowhere unless a route says
so. One decision with ``fallback_models`` (``stormguard.Fallbacks``), sync and
async, on a fake clock.

Two deployments: OpenAI (tier 1) and Azure OpenAI (tier 2), each with its own name
for the logical models "chat" (a short context) and "chat-long".
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
import respx
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import stormguard
from stormguard import Deployment, FallbackKind, Fallbacks, FallbackStep
from stormguard.telemetry import Telemetry
from stormguard.tokens import EstimatingCounter, TokenPolicy
from tests.sdk.helpers import MESSAGES, Api, chat_json

OPENAI, AZURE = "http://openai.test/v1", "http://azure.test/openai/v1"
OPENAI_KEY = "sk-openai-0123456789abcdef"
AZURE_KEY = "azure-key-0123456789abcdef"
CLIENT_KEY = "sk-test-secret-key"  # the Api helper's: never sent to a deployment
ANY = r"http://(openai|azure)\.test(:\d+)?/.*"
LONG_PROMPT = [{"role": "user", "content": "word " * 400}]


def deployments(**azure_models: str) -> list[Deployment]:
    return [
        Deployment(
            OPENAI,
            name="openai",
            models={"chat": "small-8k", "chat-long": "long-128k"},
            api_key=OPENAI_KEY,
        ),
        Deployment(
            AZURE,
            name="azure",
            tier=2,
            models={"chat": "az-small", "chat-long": "az-long", **azure_models},
            api_key=AZURE_KEY,
            api_key_header="api-key",
            query={"api-version": "preview"},
        ),
    ]


Answer = Callable[[httpx.Request, dict[str, Any]], httpx.Response]


class Providers:
    """Answers each request by the provider's model name it carries; records them."""

    def __init__(self, **by_model: Answer) -> None:
        self.by_model = by_model
        self.seen: list[tuple[str, str]] = []  # (host, model sent)

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content or b"{}")
        model = body.get("model", "")
        self.seen.append((request.url.host.split(".")[0], model))
        answer = self.by_model.get(model, ok)
        return answer(request, body)


def ok(request: httpx.Request, body: dict[str, Any]) -> httpx.Response:
    return httpx.Response(200, json=chat_json(model=body.get("model", "m")))


def too_long_openai(request: httpx.Request, body: dict[str, Any]) -> httpx.Response:
    return httpx.Response(
        400,
        json={
            "error": {
                "message": "This model's maximum context length is 8192 tokens. However,"
                " your messages resulted in 9000 tokens.",
                "type": "invalid_request_error",
                "param": "messages",
                "code": "context_length_exceeded",
            }
        },
    )


def too_long_vllm(request: httpx.Request, body: dict[str, Any]) -> httpx.Response:
    # vLLM's OpenAI server: no code, the reason in the message.
    return httpx.Response(
        400,
        json={
            "object": "error",
            "message": "This model's maximum context length is 8192 tokens. However, you"
            " requested 9000 tokens (8000 in the messages, 1000 in the completion).",
            "type": "BadRequestError",
            "param": None,
            "code": 400,
        },
    )


def content_filtered(request: httpx.Request, body: dict[str, Any]) -> httpx.Response:
    # Azure OpenAI's answer to a prompt its content filter refused.
    return httpx.Response(
        400,
        json={
            "error": {
                "message": "The response was filtered due to the prompt triggering Azure"
                " OpenAI's content management policy.",
                "type": None,
                "param": "prompt",
                "code": "content_filter",
                "status": 400,
                "innererror": {"code": "ResponsibleAIPolicyViolation"},
            }
        },
    )


@pytest.fixture
def router() -> Iterator[respx.MockRouter]:
    with respx.mock(assert_all_called=False) as mock:
        yield mock


def client_of(api: Api, **kwargs: Any) -> Any:
    kwargs.setdefault("base_url", deployments())
    kwargs.setdefault("model", "chat")
    return api.client(**kwargs)


async def chat(api: Api, client: Any, messages: Any = MESSAGES, **kwargs: Any) -> Any:
    return await api.run(client.chat.completions.create(messages=messages, **kwargs))


# -- configuration ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "error"),
    [
        ({"context_window": {"chat": []}}, r"context_window\['chat'\] is empty"),
        ({"context_window": {"chat": "chat"}}, "routes the model to itself"),
        ({"context_window": {"chat": ["a", "a"]}}, "names a model twice"),
        ({"context_window": {"chat": [""]}}, "must be a non-empty model name"),
        ({"context_window": {"": "chat-long"}}, "must be a non-empty model name"),
        ({"content_policy": {"chat": 3}}, "a model name or a list of them"),
        ({"content_policy": ["chat"]}, "must map a model to the model"),
        ({"models": ["a", "a"]}, "names a model twice"),
    ],
)
def test_bad_routes_are_a_clear_error_when_made(changes: dict[str, Any], error: str) -> None:
    with pytest.raises(ValueError, match=error):
        Fallbacks(**changes)


def test_models_must_be_a_list_not_one_string() -> None:
    with pytest.raises(TypeError, match="not one string"):
        Fallbacks(models="chat-long")  # type: ignore[arg-type]


def test_a_route_to_a_model_no_endpoint_serves_is_refused_when_the_client_is_made() -> None:
    with pytest.raises(ValueError, match="chat-huge"):
        stormguard.Client(
            base_url=deployments(),
            model="chat",
            fallback_models=Fallbacks(context_window={"chat": "chat-huge"}),
        )


def test_a_list_of_fallback_models_is_the_routes_of_unavailable_models() -> None:
    assert Fallbacks.of(["a", "b"]) == Fallbacks(models=["a", "b"])
    assert Fallbacks(context_window={"chat": "chat-long"}).context_window == {
        "chat": ("chat-long",)
    }


# -- too long for the model ---------------------------------------------------------


@pytest.mark.parametrize("refusal", [too_long_openai, too_long_vllm], ids=["openai", "vllm"])
async def test_a_request_the_server_refuses_as_too_long_goes_to_the_longer_context_model(
    api: Api, router: respx.MockRouter, refusal: Answer
) -> None:
    providers = Providers(**{"small-8k": refusal})
    route = router.post(url__regex=ANY).mock(side_effect=providers)
    client = client_of(api, fallback_models=Fallbacks(context_window={"chat": "chat-long"}))
    resp = await chat(api, client)
    # Not retried, nor failed over to tier 2: every replica and provider of the
    # model would refuse it the same way. The longer-context model takes it.
    assert providers.seen == [("openai", "small-8k"), ("openai", "long-128k")]
    assert [c.request.headers["x-stormguard-attempt"] for c in route.calls] == ["1", "1"]
    assert resp.served_model == "chat-long"
    assert resp.degraded is False  # a longer context is no degradation
    assert resp.call_info.fallbacks == (
        FallbackStep("chat", "chat-long", FallbackKind.CONTEXT_WINDOW, "BadRequestError"),
    )
    assert [(a.model, a.outcome, a.deployment) for a in resp.attempt_history] == [
        ("chat", "not_retryable", "openai"),
        ("chat-long", "ok", "openai"),
    ]
    assert client.stats().fallbacks == 1


async def test_without_a_route_a_too_long_request_fails_as_it_came(
    api: Api, router: respx.MockRouter
) -> None:
    providers = Providers(**{"small-8k": too_long_openai})
    router.post(url__regex=ANY).mock(side_effect=providers)
    # A model for when "chat" is unavailable is no route for a request too long for it.
    client = client_of(api, fallback_models=["chat-long"])
    with pytest.raises(stormguard.BadRequestError) as caught:
        await chat(api, client)
    assert caught.value.code == "context_length_exceeded"
    assert providers.seen == [("openai", "small-8k")]
    assert client.stats().fallbacks == 0


async def test_a_chain_of_routes_ends_once_each_model_is_tried(
    api: Api, router: respx.MockRouter
) -> None:
    providers = Providers(**{"small-8k": too_long_openai, "long-128k": too_long_openai})
    router.post(url__regex=ANY).mock(side_effect=providers)
    routes = Fallbacks(context_window={"chat": "chat-long", "chat-long": "chat"})
    client = client_of(api, fallback_models=routes)
    with pytest.raises(stormguard.BadRequestError) as caught:
        await chat(api, client)
    assert providers.seen == [("openai", "small-8k"), ("openai", "long-128k")]
    assert [(a.model, a.outcome) for a in caught.value.attempt_history] == [
        ("chat", "not_retryable"),
        ("chat-long", "not_retryable"),
    ]


def offline_policy(**windows: int) -> TokenPolicy:
    return TokenPolicy(
        counters={"*": EstimatingCounter()},
        context_windows=windows,
        server_context_windows=False,
        server_tokenize=False,
    )


async def test_a_precheck_refusal_goes_to_the_longer_context_model_before_anything_is_sent(
    api: Api, router: respx.MockRouter
) -> None:
    providers = Providers()
    router.post(url__regex=ANY).mock(side_effect=providers)
    client = client_of(
        api,
        # The windows are the providers' (by their names for the models).
        token_policy=offline_policy(**{"small-8k": 500, "long-128k": 128_000}),
        fallback_models=Fallbacks(context_window={"chat": "chat-long"}),
    )
    resp = await chat(api, client, LONG_PROMPT, max_tokens=10)
    assert providers.seen == [("openai", "long-128k")]  # "chat" was never sent
    assert resp.served_model == "chat-long"
    assert (resp.precheck.model, resp.precheck.fallback_from) == ("chat-long", "chat")
    assert resp.precheck.context_window == 128_000
    assert resp.call_info.fallbacks == (
        FallbackStep(
            "chat", "chat-long", FallbackKind.CONTEXT_WINDOW, "ContextWindowExceededError"
        ),
    )
    assert [(a.model, a.outcome) for a in resp.attempt_history] == [("chat-long", "ok")]


async def test_the_token_policys_context_fallbacks_are_routes_of_the_same_decision(
    api: Api, router: respx.MockRouter
) -> None:
    providers = Providers(**{"small-8k": too_long_openai})
    router.post(url__regex=ANY).mock(side_effect=providers)
    policy = TokenPolicy(
        counters={"*": EstimatingCounter()},
        server_context_windows=False,
        server_tokenize=False,
        context_fallbacks={"chat": "chat-long"},
    )
    client = client_of(api, token_policy=policy)
    # The pre-check knows no window here; the server's 400 moves the call by the
    # policy's route, as a refusal by the pre-check would.
    resp = await chat(api, client)
    assert providers.seen == [("openai", "small-8k"), ("openai", "long-128k")]
    assert resp.call_info.fallbacks[0].kind is FallbackKind.CONTEXT_WINDOW


async def test_the_precheck_looks_the_model_up_at_its_deployment_under_its_name(
    api: Api, router: respx.MockRouter
) -> None:
    # "chat" is served at tier 1 by Azure only (OpenAI, listed first, serves
    # "chat-long" only): the model list is asked of Azure, with Azure's key and query,
    # and read for Azure's name of the model.
    base_url = [
        Deployment(OPENAI, name="openai", models={"chat-long": "long-128k"}, api_key=OPENAI_KEY),
        Deployment(
            AZURE,
            name="azure",
            models={"chat": "az-small"},
            api_key=AZURE_KEY,
            api_key_header="api-key",
            query={"api-version": "preview"},
        ),
    ]
    listed = router.get(url__regex=r"http://azure\.test/openai/v1/models.*").respond(
        200,
        json={"object": "list", "data": [{"id": "az-small", "max_model_len": 300}]},
    )
    router.get(url__regex=r"http://openai\.test/v1/models.*").respond(
        200,
        json={"object": "list", "data": [{"id": "long-128k", "max_model_len": 128_000}]},
    )
    providers = Providers()
    router.post(url__regex=ANY).mock(side_effect=providers)
    policy = TokenPolicy(counters={"*": EstimatingCounter()}, server_tokenize=False)
    client = client_of(
        api,
        base_url=base_url,
        token_policy=policy,
        fallback_models=Fallbacks(context_window={"chat": "chat-long"}),
    )
    resp = await chat(api, client, LONG_PROMPT, max_tokens=10)
    [lookup] = listed.calls
    assert lookup.request.url.params["api-version"] == "preview"
    assert lookup.request.headers["api-key"] == AZURE_KEY
    assert "authorization" not in lookup.request.headers  # never the client's key
    assert providers.seen == [("openai", "long-128k")]
    assert resp.precheck.context_window == 128_000
    assert resp.call_info.fallbacks[0].error_type == "ContextWindowExceededError"


# -- a content filter's refusal -----------------------------------------------------


async def test_a_content_filters_refusal_goes_nowhere_else_unless_configured(
    api: Api, router: respx.MockRouter
) -> None:
    providers = Providers(**{"small-8k": content_filtered})
    router.post(url__regex=ANY).mock(side_effect=providers)
    client = client_of(
        api,
        fallback_models=Fallbacks(models=["chat-long"], context_window={"chat": "chat-long"}),
    )
    with pytest.raises(stormguard.BadRequestError) as caught:
        await chat(api, client)
    assert caught.value.code == "content_filter"
    # Not to the next tier, nor to another model: one request in all.
    assert providers.seen == [("openai", "small-8k")]
    assert client.stats().fallbacks == 0


async def test_a_configured_content_policy_route_takes_the_refused_request(
    api: Api, router: respx.MockRouter
) -> None:
    providers = Providers(**{"small-8k": content_filtered})
    router.post(url__regex=ANY).mock(side_effect=providers)
    client = client_of(
        api,
        base_url=deployments(**{"chat-lenient": "az-lenient"}),
        fallback_models=Fallbacks(content_policy={"chat": "chat-lenient"}),
    )
    resp = await chat(api, client)
    assert providers.seen == [("openai", "small-8k"), ("azure", "az-lenient")]
    assert resp.deployment == "azure"
    assert resp.call_info.fallbacks == (
        FallbackStep("chat", "chat-lenient", FallbackKind.CONTENT_POLICY, "BadRequestError"),
    )


# -- visible ------------------------------------------------------------------------


async def test_a_fallback_is_in_the_span_and_one_log_line_with_why(
    api: Api, router: respx.MockRouter, caplog: pytest.LogCaptureFixture
) -> None:
    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    providers = Providers(**{"small-8k": too_long_openai})
    router.post(url__regex=ANY).mock(side_effect=providers)
    client = client_of(
        api,
        telemetry=Telemetry(tracer_provider=tracer_provider),
        fallback_models=Fallbacks(context_window={"chat": "chat-long"}),
    )
    with caplog.at_level(logging.INFO, logger="stormguard"):
        await chat(api, client)
    [call] = [s for s in exporter.get_finished_spans() if s.name.startswith("chat ")]
    assert call.attributes["stormguard.fallback.kind"] == "context_window"
    [event] = [e for e in call.events if e.name == "stormguard.fallback"]
    assert event.attributes["stormguard.fallback.kind"] == "context_window"
    assert event.attributes["stormguard.fallback.model"] == "chat-long"
    lines = [r.getMessage() for r in caplog.records if "moves from model" in r.getMessage()]
    assert len(lines) == 1
    assert "chat to chat-long (context_window)" in lines[0]
    assert "BadRequestError 400" in lines[0]
    assert OPENAI_KEY not in lines[0] and CLIENT_KEY not in lines[0]
