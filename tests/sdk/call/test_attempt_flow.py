"""The attempt flow without any I/O: the actions it asks for, and how it maps their failures."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

import stormguard
from stormguard._call.attempt_flow import (
    Action,
    CloseResponse,
    OpenStream,
    ReadBody,
    Send,
    WaitForSlot,
    attempt_flow,
    run_sync,
)
from stormguard._call.call_spec import CallSpec
from stormguard._call.call_state import CallProtocolError, CallState
from stormguard._call.pipeline import LogicalCall
from stormguard._core.results import ChatCompletion
from tests.sdk.helpers import MESSAGES, Api, chat_json

Perform = Callable[[LogicalCall, Action], Any]


@pytest.fixture
def client() -> Iterator[stormguard.Client]:
    client = Api("sync").client()
    yield client
    client.close()


def new_call(client: stormguard.Client) -> LogicalCall:
    body = {"model": "m", "messages": MESSAGES}
    spec = CallSpec("POST", "/chat/completions", ChatCompletion, "chat", body=body, model="m")
    return LogicalCall(client._core, spec)


def server(
    status: int, body: bytes, *, fail: dict[type[Action], BaseException] | None = None
) -> tuple[Perform, list[Action]]:
    """A ``perform`` that answers ``status`` with ``body``, raising ``fail[type]`` for an
    action of that type; it records the actions it was asked for."""
    seen: list[Action] = []
    fail = fail or {}

    def perform(_call: LogicalCall, action: Action) -> Any:
        seen.append(action)
        if type(action) in fail:
            raise fail[type(action)]
        if isinstance(action, Send):  # a body still to read: the response stays open
            return httpx.Response(status, stream=httpx.ByteStream(body), request=action.request)
        if isinstance(action, ReadBody):
            action.reader.feed(body)
        if isinstance(action, CloseResponse):
            action.response.close()
        return None

    return perform, seen


def kinds(seen: list[Action]) -> list[type[Action]]:
    return [type(action) for action in seen]


def test_a_success_sends_reads_and_closes(client: stormguard.Client) -> None:
    call = new_call(client)
    perform, seen = server(200, httpx.Response(200, json=chat_json("hi")).content)
    result = run_sync(attempt_flow(call, client._http), perform, call)
    assert result.choices[0].message.content == "hi"
    assert kinds(seen) == [Send, ReadBody, CloseResponse]
    assert isinstance(seen[-1], CloseResponse) and not seen[-1].failed
    assert call.machine.state is CallState.RECEIVING  # the driver's finish() ends it


def test_a_response_closed_by_reading_its_body_is_not_closed_again(
    client: stormguard.Client,
) -> None:
    call = new_call(client)
    seen: list[Action] = []

    def perform(_call: LogicalCall, action: Action) -> Any:
        seen.append(action)
        if isinstance(action, Send):
            body = httpx.Response(200, json=chat_json("hi")).content
            return httpx.Response(200, stream=httpx.ByteStream(body), request=action.request)
        if isinstance(action, ReadBody):  # read to its end: httpx closes the response
            action.reader.feed(b"".join(action.response.iter_raw()))
            assert action.response.is_closed
        return None

    result = run_sync(attempt_flow(call, client._http), perform, call)
    assert result.choices[0].message.content == "hi"
    assert kinds(seen) == [Send, ReadBody]


def test_a_status_error_is_read_closed_then_raised(client: stormguard.Client) -> None:
    call = new_call(client)
    perform, seen = server(500, b'{"error": {"message": "boom"}}')
    with pytest.raises(stormguard.InternalServerError):
        run_sync(attempt_flow(call, client._http), perform, call)
    assert kinds(seen) == [Send, ReadBody, CloseResponse]  # its body is the error's
    assert isinstance(seen[-1], CloseResponse) and not seen[-1].failed
    assert call.machine.state is CallState.ATTEMPT_FAILED


@pytest.mark.parametrize(
    ("raised", "error", "message"),
    [
        (httpx.ConnectError("refused"), stormguard.APIConnectionError, "Connection error"),
        (httpx.ReadTimeout("slow"), stormguard.APITimeoutError, "Request timed out"),
        # The async client's cancel scope: the call's deadline passed.
        (TimeoutError(), stormguard.APITimeoutError, "deadline passed while waiting"),
    ],
)
def test_a_failed_send_becomes_the_calls_error(
    client: stormguard.Client, raised: Exception, error: type[Exception], message: str
) -> None:
    call = new_call(client)
    perform, seen = server(200, b"", fail={Send: raised})
    with pytest.raises(error, match=message) as info:
        run_sync(attempt_flow(call, client._http), perform, call)
    assert kinds(seen) == [Send]  # no response: nothing to close
    assert info.value.__cause__ is raised
    assert not getattr(info.value, "response_started", False)
    assert call.machine.state is CallState.ATTEMPT_FAILED


@pytest.mark.parametrize(
    ("raised", "error"),
    [
        (httpx.ReadError("cut"), stormguard.APIConnectionError),
        (httpx.ReadTimeout("slow"), stormguard.APITimeoutError),
        (TimeoutError(), stormguard.APITimeoutError),
    ],
)
def test_a_failed_read_closes_the_response(
    client: stormguard.Client, raised: Exception, error: type[Exception]
) -> None:
    call = new_call(client)
    perform, seen = server(200, b"{}", fail={ReadBody: raised})
    with pytest.raises(error) as info:
        run_sync(attempt_flow(call, client._http), perform, call)
    assert kinds(seen) == [Send, ReadBody, CloseResponse]
    assert isinstance(seen[-1], CloseResponse) and seen[-1].failed
    if isinstance(info.value, stormguard.APITimeoutError):
        assert info.value.response_started  # a retry would generate twice


def test_a_cancellation_mid_read_closes_the_response_and_goes_on(
    client: stormguard.Client,
) -> None:
    call = new_call(client)
    perform, seen = server(200, b"{}", fail={ReadBody: KeyboardInterrupt()})
    with pytest.raises(KeyboardInterrupt):
        run_sync(attempt_flow(call, client._http), perform, call)
    assert kinds(seen) == [Send, ReadBody, CloseResponse]


def test_a_stream_is_opened_not_read(client: stormguard.Client) -> None:
    call = new_call(client)
    call.spec = CallSpec(
        "POST",
        "/chat/completions",
        ChatCompletion,
        "chat",
        body={"model": "m", "messages": MESSAGES, "stream": True},
        model="m",
        stream=True,
        chunk_type=stormguard.ChatCompletionChunk,
    )
    perform, seen = server(200, b"")
    assert run_sync(attempt_flow(call, client._http), perform, call) is None  # what OpenStream gave
    assert kinds(seen) == [Send, OpenStream]


def test_a_full_endpoint_waits_for_its_slot(client: stormguard.Client) -> None:
    limiter = client._core.limiter
    assert limiter is not None
    first = new_call(client)
    assert first.reserve() is None  # a slot at once
    assert first._endpoint_choice is not None
    for _ in range(limiter.endpoint(first._endpoint_choice.name).limit - 1):
        assert new_call(client).reserve() is None  # until the limit is full
    call = new_call(client)
    flow = attempt_flow(call, client._http)
    action = next(flow)
    assert isinstance(action, WaitForSlot)
    flow.close()


def test_a_step_out_of_order_raises(client: stormguard.Client) -> None:
    call = new_call(client)
    assert call.reserve() is None
    call.begin_attempt(client._http)
    with pytest.raises(CallProtocolError, match="step 'begin_attempt' in state sending"):
        call.begin_attempt(client._http)
