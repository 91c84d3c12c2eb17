"""TokenPolicy.precheck_flow: refusals before any attempt, windows in their order, fallbacks."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import respx

from stormguard._core.exceptions import ContextWindowExceededError
from stormguard.tokens import (
    EstimatingCounter,
    ModelMap,
    Precheck,
    TiktokenCounter,
    TokenPolicy,
    TokenRateLimiter,
    known_context_window,
    run_precheck_async,
    run_precheck_sync,
)
from tests.sdk.tokens.test_tokens_support import FakeClock

BASE = "http://llm.test/v1"
MODELS = "http://llm.test/v1/models"
TOKENIZE = "http://llm.test/tokenize"
COMPLETIONS = "http://llm.test/v1/chat/completions"


def _chat(content: str, **extra: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": content}], **extra}


def _models(*entries: tuple[str, int | None]) -> httpx.Response:
    data = [{"id": m, "object": "model", **({"max_model_len": n} if n else {})} for m, n in entries]
    return httpx.Response(200, json={"object": "list", "data": data})


@pytest.fixture
def router() -> Iterator[respx.MockRouter]:
    with respx.mock(assert_all_called=False) as mock:
        mock.post(COMPLETIONS).respond(200, json={})
        yield mock


def _run(policy: TokenPolicy, model: str, body: dict[str, Any], kind: str = "chat") -> Precheck:
    with httpx.Client() as client:
        flow = policy.precheck_flow(model, kind, body, base_url=BASE)  # type: ignore[arg-type]
        return run_precheck_sync(flow, client)


def _words(n: int) -> str:
    return " hello" * n  # one o200k / cl100k token per word


def test_an_over_long_request_is_refused_with_the_numbers(router: respx.MockRouter) -> None:
    router.get(MODELS).mock(return_value=_models(("other-model", 1)))
    with pytest.raises(ContextWindowExceededError) as caught:
        _run(TokenPolicy(), "gpt-4", _chat(_words(8000), max_tokens=500))
    error = caught.value
    prompt = TiktokenCounter("cl100k_base").count_messages(
        [{"role": "user", "content": _words(8000)}]
    )
    assert (error.model, error.prompt_tokens, error.max_tokens) == ("gpt-4", prompt, 500)
    assert (error.context_window, error.counter) == (8192, "tiktoken:cl100k_base")
    for part in (str(prompt), "500", "8192", "tiktoken:cl100k_base"):
        assert part in error.message
    assert error.attempts == 0
    assert not router.routes[0].called  # nothing reached the completions route


def test_with_a_configured_window_nothing_is_sent_at_all(router: respx.MockRouter) -> None:
    policy = TokenPolicy(context_windows={"gpt-4o*": 1000})
    with pytest.raises(ContextWindowExceededError, match="exceeds the context window of 1000"):
        _run(policy, "gpt-4o-mini", _chat(_words(990), max_tokens=20))
    assert router.calls.call_count == 0


def test_a_fitting_request_reports_counter_and_window(router: respx.MockRouter) -> None:
    router.get(MODELS).mock(return_value=_models())
    check = _run(TokenPolicy(), "gpt-4o", _chat("hi", max_completion_tokens=7))
    assert check == Precheck(
        model="gpt-4o",
        prompt_tokens=TiktokenCounter("o200k_base").count_messages(
            [{"role": "user", "content": "hi"}]
        ),
        max_tokens=7,
        context_window=128_000,
        counter="tiktoken:o200k_base",
        fallback_from=None,
        context_window_source="table",
    )
    assert check.cost == check.prompt_tokens + 7


def test_the_old_names_of_context_window_settings_still_work_and_warn() -> None:
    check = Precheck("m", 1, 1, 10, "c", context_window_source="config")
    with pytest.warns(DeprecationWarning, match="context_window_source"):
        assert check.window_source == "config"
    with pytest.warns(DeprecationWarning, match="server_context_windows"):
        policy = TokenPolicy(server_windows=False)
    assert policy.use_server_context_windows is False


def test_the_servers_max_model_len_beats_the_table(router: respx.MockRouter) -> None:
    router.get(MODELS).mock(return_value=_models(("gpt-4o", 2048)))
    with pytest.raises(ContextWindowExceededError) as caught:
        _run(TokenPolicy(), "gpt-4o", _chat(_words(2000), max_tokens=100))
    assert caught.value.context_window == 2048


def test_configuration_beats_the_server(router: respx.MockRouter) -> None:
    models = router.get(MODELS).mock(return_value=_models(("gpt-4o", 2048)))
    check = _run(TokenPolicy(context_windows={"gpt-4o": 9000}), "gpt-4o", _chat(_words(3000)))
    assert (check.context_window, check.context_window_source) == (9000, "config")
    assert not models.called


def test_models_are_fetched_once_per_endpoint(router: respx.MockRouter) -> None:
    first = router.get(MODELS).mock(return_value=_models(("gpt-4o", 4096)))
    other = router.get("http://other.test/v1/models").mock(return_value=_models(("gpt-4o", 1999)))
    policy = TokenPolicy()
    assert _run(policy, "gpt-4o", _chat("a")).context_window == 4096
    assert _run(policy, "gpt-4o-mini", _chat("b")).context_window == 128_000  # not listed
    with httpx.Client() as client:
        flow = policy.precheck_flow("gpt-4o", "chat", _chat("c"), base_url="http://other.test/v1")
        assert run_precheck_sync(flow, client).context_window == 1999
    assert (first.call_count, other.call_count) == (1, 1)


def test_a_failing_models_endpoint_is_asked_again_only_later(router: respx.MockRouter) -> None:
    models = router.get(MODELS).mock(side_effect=httpx.ConnectError("down"))
    clock = FakeClock()
    policy = TokenPolicy(server_retry_after=60, clock=clock)
    assert _run(policy, "gpt-4o", _chat("a")).context_window_source == "table"
    clock.advance(59)
    _run(policy, "gpt-4o", _chat("a"))
    assert models.call_count == 1
    clock.advance(2)
    models.mock(return_value=_models(("gpt-4o", 5000)), side_effect=None)
    assert _run(policy, "gpt-4o", _chat("a")).context_window == 5000


def test_an_unknown_model_is_counted_and_sized_by_the_server(router: respx.MockRouter) -> None:
    tokenize = router.post(TOKENIZE).respond(
        200, json={"count": 4000, "tokens": [0] * 4000, "max_model_len": 4096}
    )
    models = router.get(MODELS).mock(return_value=_models(("llama", 100_000)))
    with pytest.raises(ContextWindowExceededError) as caught:
        _run(TokenPolicy(), "llama", _chat("x", max_tokens=200))
    assert (caught.value.counter, caught.value.context_window) == ("server:/tokenize", 4096)
    assert tokenize.called and not models.called  # /tokenize already said max_model_len


def test_an_unknown_model_without_tokenize_falls_back_to_the_estimate(
    router: respx.MockRouter,
) -> None:
    router.post(TOKENIZE).respond(404)
    router.get(MODELS).mock(return_value=_models(("llama", 100_000)))
    check = _run(TokenPolicy(), "llama", _chat("héllo"))
    assert check.counter == "estimate:utf8-bytes"
    assert check.prompt_tokens == EstimatingCounter().count_messages(
        [{"role": "user", "content": "héllo"}]
    )
    assert (check.context_window, check.context_window_source) == (100_000, "server")


def test_an_unknown_window_is_not_checked(router: respx.MockRouter) -> None:
    router.post(TOKENIZE).respond(404)
    router.get(MODELS).mock(return_value=_models())
    check = _run(TokenPolicy(), "mystery", _chat(_words(10)))
    assert (check.context_window, check.context_window_source) == (None, None)


def test_the_default_completion_length_applies_and_is_explained(router: respx.MockRouter) -> None:
    policy = TokenPolicy(
        counters={"*": EstimatingCounter()},
        context_windows={"*": 100},
        default_max_tokens={"small-*": 10},
    )
    body = _chat("hi")  # 22 tokens by the estimate
    assert _run(policy, "small-1", body).max_tokens == 10
    with pytest.raises(ContextWindowExceededError, match="1024 is the default completion length"):
        _run(policy, "big-1", body)


def test_the_context_fallback_is_used_instead_of_failing(router: respx.MockRouter) -> None:
    router.get(MODELS).mock(return_value=_models())
    policy = TokenPolicy(context_fallbacks={"gpt-4": "gpt-4-turbo"})
    check = _run(policy, "gpt-4", _chat(_words(9000), max_tokens=100))
    assert (check.model, check.fallback_from, check.context_window) == (
        "gpt-4-turbo",
        "gpt-4",
        128_000,
    )


def test_fallback_chains_stop_at_a_cycle(router: respx.MockRouter) -> None:
    policy = TokenPolicy(
        context_windows={"a": 100, "b": 200},
        context_fallbacks={"a": "b", "b": "a"},
        counters={"*": EstimatingCounter()},
    )
    with pytest.raises(ContextWindowExceededError, match="fallbacks tried: a -> b") as caught:
        _run(policy, "a", _chat("x" * 500, max_tokens=1))
    assert (caught.value.model, caught.value.context_window) == ("b", 200)


def test_configured_counters_match_by_glob(router: respx.MockRouter, tmp_path: Any) -> None:
    router.get(MODELS).mock(return_value=_models(("meta-llama/Llama-3", 8192)))
    policy = TokenPolicy(counters={"meta-llama/*": TiktokenCounter("cl100k_base")})
    check = _run(policy, "meta-llama/Llama-3", _chat("hi"))
    assert (check.counter, check.context_window) == ("tiktoken:cl100k_base", 8192)


def test_completion_prompts_of_token_ids_are_exact(router: respx.MockRouter) -> None:
    router.get(MODELS).mock(return_value=_models())
    check = _run(
        TokenPolicy(),
        "gpt-3.5-turbo-instruct",
        {"prompt": [1] * 4000, "max_tokens": 96},
        "completion",
    )
    assert (check.prompt_tokens, check.context_window) == (4000, 4096)


def test_lookups_carry_the_clients_headers(router: respx.MockRouter) -> None:
    models = router.get(MODELS).mock(return_value=_models())
    with httpx.Client(headers={"authorization": "Bearer sk-test"}) as client:
        run_precheck_sync(
            TokenPolicy().precheck_flow("gpt-4o", "chat", _chat("a"), base_url=BASE), client
        )
    assert models.calls.last.request.headers["authorization"] == "Bearer sk-test"


async def test_the_async_driver_gives_the_same_result(router: respx.MockRouter) -> None:
    router.get(MODELS).mock(return_value=_models(("gpt-4o", 3000)))
    policy = TokenPolicy()
    async with httpx.AsyncClient() as client:
        flow = policy.precheck_flow("gpt-4o", "chat", _chat(_words(10)), base_url=BASE)
        check = await run_precheck_async(flow, client)
    assert check == _run(TokenPolicy(), "gpt-4o", _chat(_words(10)))
    with pytest.raises(ContextWindowExceededError):
        async with httpx.AsyncClient() as client:
            flow = policy.precheck_flow("gpt-4o", "chat", _chat(_words(3000)), base_url=BASE)
            await run_precheck_async(flow, client)


def test_precheck_without_a_server_uses_config_tiktoken_and_table() -> None:
    check = TokenPolicy().precheck("o3-mini", "chat", _chat("hi", max_tokens=1))
    assert (check.counter, check.context_window, check.context_window_source) == (
        "tiktoken:o200k_base",
        200_000,
        "table",
    )
    assert TokenPolicy().precheck("llama", "chat", _chat("hi")).counter == "estimate:utf8-bytes"


def test_reserve_charges_prompt_plus_max_tokens() -> None:
    clock = FakeClock()
    limiter = TokenRateLimiter(6000, burst=1000, clock=clock)
    policy = TokenPolicy(rate_limiter=limiter)
    check = policy.precheck("gpt-4o", "chat", _chat("hi", max_tokens=100))
    reservation = policy.reserve(check, max_wait=1.0)
    assert reservation is not None and reservation.tokens == check.cost
    assert limiter.available == pytest.approx(1000 - check.cost)
    assert TokenPolicy().reserve(check) is None


def test_prompts_are_never_modified() -> None:
    body = _chat(_words(10000), max_tokens=10)
    snapshot = repr(body)
    with pytest.raises(ContextWindowExceededError):
        TokenPolicy().precheck("gpt-4", "chat", body)
    assert repr(body) == snapshot


@pytest.mark.parametrize(
    ("model", "window"),
    [
        ("gpt-4o", 128_000),
        ("gpt-4o-mini", 128_000),
        ("gpt-4o-2024-08-06", 128_000),
        ("gpt-4-turbo", 128_000),
        ("gpt-4", 8192),
        ("gpt-4-0613", 8192),
        ("gpt-4-32k", 32_768),
        ("gpt-3.5-turbo", 16_385),
        ("gpt-3.5-turbo-0613", 4096),
        ("o1", 200_000),
        ("o1-mini", 128_000),
        ("o3-mini", 200_000),
        ("o4-mini", 200_000),
        ("gpt-4.1", 1_047_576),
        ("ft:gpt-4o-mini-2024-07-18:acme::x1", 128_000),
        ("llama", None),
    ],
)
def test_known_context_windows(model: str, window: int | None) -> None:
    assert known_context_window(model) == window


def test_model_map_prefers_exact_then_the_longest_glob() -> None:
    table = ModelMap({"gpt-4*": 1, "gpt-4o*": 2, "gpt-4o-mini": 3})
    assert [table.lookup(m) for m in ("gpt-4o-mini", "gpt-4o-x", "gpt-4-x", "o1")] == [
        3,
        2,
        1,
        None,
    ]
    assert (
        len(table) == 3
        and table["gpt-4*"] == 1
        and list(table) == ["gpt-4*", "gpt-4o*", "gpt-4o-mini"]
    )
