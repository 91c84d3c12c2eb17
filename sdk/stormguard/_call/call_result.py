"""How a call ends: the result of a read response (or the status error to retry),
the hand-over modes and what they give back (``Delivery``), the history attached
to a result, and the error that leaves the call with its attempts, history and
stop reason.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

from .._core.exceptions import APIError, StormguardError
from .._core.http import httpx, response_types
from .._core.results import CALL_INFO_EXTENSION, APIResult, CallInfo, output_text_of
from .._io.body import read_response
from .._io.decoding import (
    error_from_response,
    parse_json_object,
    request_id_of,
    result_from_response,
)
from ..openai_errors import as_openai_error
from ..telemetry._events import ResponseSummary
from .attempt_record import close_record, failed, stop_open_attempt
from .call_base import OK, CallBase
from .call_events import ended
from .call_quota import quota_counted, quota_learns
from .streaming import _StreamBase

__all__ = [
    "Delivery",
    "annotate",
    "call_info",
    "closed_after_hand_over",
    "complete",
    "failed_after_hand_over",
    "finish",
    "handed_over",
    "result_of_body",
    "settle",
    "succeeded",
    "succeeded_info",
    "summarize",
]

R = TypeVar("R", bound=APIResult)


@dataclass(slots=True)
class Delivery:
    """What a call in a hand-over mode returns to the facade: the final attempt's
    response and what it carries (``_client/raw_response.py`` and
    ``_client/streamed_response.py`` wrap it for the caller)."""

    call: CallBase
    #: The final attempt's response: its body read ("response" mode, a non-stream),
    #: or open (a stream, or a body not read yet).
    response: httpx.Response
    #: The result, the ``Stream``/``AsyncStream``, or None: a body not read yet.
    result: Any
    info: CallInfo
    #: The final attempt's time from sending to the end of its body (None: not over).
    elapsed: timedelta | None = None


def settle(call: CallBase, usage: object) -> None:
    """An answer's ``usage``: refund the unused part of the rate-limit reservation,
    and let the provider's count of the prompt correct the key's quota estimate."""
    if not isinstance(usage, Mapping):
        return
    total_tokens = usage.get("total_tokens")
    if call._reservation is not None and isinstance(total_tokens, int):
        call._reservation.settle(total_tokens)
        call._reservation = None
    quota_counted(call, usage)


def complete(call: CallBase, response: httpx.Response, body: bytes) -> APIResult | httpx.Response:
    """The result of a read response, or the status error to raise (and retry).
    In transport mode the result is the response itself, body read."""
    if response.status_code >= 300:
        raise failed(
            call,
            error_from_response(
                response, body, server_load=call.server_load, redactor=call.redactor
            ),
        )
    if call.spec.raw:
        return read_response(response, body)
    try:
        result = result_from_response(
            response,
            body,
            call.spec.result_type,
            info=call_info(call, response),
            redactor=call.redactor,
        )
    except APIError as exc:
        raise failed(call, exc) from None
    if call.spec.hand_over == "response":
        call._read = (read_response(response, body), response.elapsed)
    return result


def handed_over(call: CallBase, response: httpx.Response) -> httpx.Response:
    """A success handed to the caller before its body is read
    (``with_streaming_response``): the attempt succeeded at its headers, so no
    retry follows; the call ends when the caller has read the body or closed it."""
    call._unread_info = info = call_info(call, response)
    succeeded_info(call, info)
    return response


def result_of_body(call: CallBase, response: httpx.Response, body: bytes) -> APIResult:
    """The result of a body the caller read after the hand-over; the call ends here."""
    assert call._unread_info is not None
    try:
        result = result_from_response(
            response,
            body,
            call.spec.result_type,
            info=call._unread_info,
            redactor=call.redactor,
        )
    except APIError as exc:
        raise failed_after_hand_over(call, exc) from None
    succeeded(call, result)
    ended(call, response=summarize(result))
    return result


def failed_after_hand_over(call: CallBase, error: APIError) -> APIError:
    """An error reading a body after the hand-over: not retried (the caller has
    the response), annotated with the call's history; the call ends with it."""
    if error.request is None:
        error.request = call._request
    annotate(call, error)
    ended(call, error)
    return error


def closed_after_hand_over(call: CallBase, body: bytes | None) -> None:
    """The caller closed a handed-over response: the call ends, with the summary of
    the body read, or as cancelled if the body was not read to its end."""
    if body is None:
        ended(call, cancelled=True)
        return
    payload = parse_json_object(body)
    if payload is not None:
        settle(call, payload.get("usage"))
    ended(call, response=None if payload is None else summarize(payload))


def call_info(call: CallBase, response: httpx.Response) -> CallInfo:
    """What the result will say about this call (history completed on success)."""
    info = CallInfo(
        server_load=call.server_load,
        attempt_history=(),
        request_id=request_id_of(response, redactor=call.redactor),
        model=call.spec.model,
        rate_limit=call.rate_limit,
    )
    quota = call._quota
    if quota is not None:
        info.quota_wait_s, info.paced_429s = quota.wait_s, quota.paced
    return info


def finish(call: CallBase, result: R | httpx.Response | object) -> Any:
    """The call's answer: a record gets the history attached; a transport-mode
    response closes its attempt and carries the ``CallInfo`` in its extensions;
    a stream closed its attempt at its first chunk.
    In a hand-over mode the answer is a ``Delivery`` of all that and the response."""
    if call.spec.hand_over:
        return _delivery(call, result)
    if isinstance(result, APIResult):
        return _finished(call, result)
    if isinstance(result, response_types()):
        info = call_info(call, result)
        payload = None
        if (
            call._trace is not None
            or call._reservation is not None
            or quota_learns(call)
            or call.core.latency_routing is not None
        ):
            payload = parse_json_object(result.content)
        usage = None if payload is None else payload.get("usage")
        succeeded_info(call, info, usage)
        result.extensions[CALL_INFO_EXTENSION] = info
        if payload is not None:
            settle(call, usage)
        if call._trace is not None:
            ended(call, response=None if payload is None else summarize(payload))
    return result


def _delivery(call: CallBase, result: object) -> Delivery:
    delivery = _delivered(call, result)
    delivery.response.extensions[CALL_INFO_EXTENSION] = delivery.info
    return delivery


def _delivered(call: CallBase, result: object) -> Delivery:
    if isinstance(result, APIResult):  # "response" mode: the body was read
        result = _finished(call, result)
        assert result.call_info is not None and call._read is not None
        response, elapsed = call._read
        return Delivery(call, response, result, result.call_info, elapsed)
    if isinstance(result, response_types()):  # "unread" mode, not a stream
        assert call._unread_info is not None
        return Delivery(call, result, None, call._unread_info)
    assert isinstance(result, _StreamBase)  # a stream, in either mode
    return Delivery(call, result.response, result, result.call_info)


def _finished(call: CallBase, result: R) -> R:
    result = succeeded(call, result)
    if call._trace is not None:
        ended(call, response=summarize(result))
    return result


def succeeded(call: CallBase, result: R) -> R:
    """Close the history with an ``ok`` attempt and attach it to the result."""
    usage = result.get("usage")
    if result.call_info is not None:
        succeeded_info(call, result.call_info, usage)
    settle(call, usage)
    return result


def succeeded_info(call: CallBase, info: CallInfo, usage: object = None) -> None:
    """Close the history with an ``ok`` attempt (its answer's ``usage``, when known)
    and attach it to ``info``."""
    close_record(call, OK, usage)
    call.machine.step("succeeded")
    info.attempt_history = tuple(call.history)
    info.precheck = call.precheck
    info.degraded_from = call.degraded_from
    info.fallbacks = tuple(call.fallback_steps)
    info.model = call.spec.model


def annotate(call: CallBase, error: StormguardError) -> None:
    """Give the error the call's attempt count, history and stop reason."""
    call.redactor.scrub_error(error)
    stop_open_attempt(call)
    # The error leaves the call: its traceback holds frames that hold the call.
    call._attempt_error = None
    error.attempts = call.total_attempts
    error.attempt_history = tuple(call.history)
    error.retry_stopped_by = call.retry_stopped_by
    error.precheck = call.precheck
    if call._reservation is not None and call.total_attempts > 0:
        # The call failed: its tokens were not used (a server that failed does not
        # count them either), so they go back to the rate limiter.
        call._reservation.cancel()
        call._reservation = None
    if isinstance(error, APIError) and error.server_load.is_empty:
        error.server_load = call.server_load
    if isinstance(error, APIError) and error.rate_limit.is_empty:
        error.rate_limit = call.rate_limit
    if call.core.openai_errors:  # the error leaves the call here: openai's class too
        as_openai_error(error)


def summarize(result: APIResult | Mapping[str, Any]) -> ResponseSummary:
    """The id, model, finish reasons, usage and text of a (non-streamed) result."""
    usage = result.get("usage")
    usage = usage if isinstance(usage, Mapping) else {}
    reasons: list[str] = []
    texts: list[str] = []
    choices = result.get("choices")
    for choice in choices if isinstance(choices, list) else ():
        if not isinstance(choice, Mapping):
            continue
        reason = choice.get("finish_reason")
        if isinstance(reason, str):
            reasons.append(reason)
        message = choice.get("message")
        text = message.get("content") if isinstance(message, Mapping) else choice.get("text")
        if isinstance(text, str):
            texts.append(text)
    status, output = result.get("status"), result.get("output")
    if isinstance(output, list) and isinstance(status, str):  # a Responses API response
        reasons.append(status)
        texts.append(output_text_of(output))
    response_id, model = result.get("id"), result.get("model")
    prompt = usage.get("prompt_tokens", usage.get("input_tokens"))
    completion = usage.get("completion_tokens", usage.get("output_tokens"))
    return ResponseSummary(
        response_id=response_id if isinstance(response_id, str) else None,
        response_model=model if isinstance(model, str) else None,
        finish_reasons=tuple(reasons),
        input_tokens=prompt if isinstance(prompt, int) else None,
        output_tokens=completion if isinstance(completion, int) else None,
        output_text=tuple(texts),
    )
