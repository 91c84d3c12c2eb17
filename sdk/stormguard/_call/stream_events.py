"""What each event of a stream means (``StreamEvents``): a chunk, the end, or a
failure, in either dialect of SSE.

Chat and completions send chunks, an ``error`` member for a failure and
``data: [DONE]`` at the end; the Responses API sends typed events, ``type:
"error"`` or ``response.failed`` for a failure, and ``response.completed`` or
``response.incomplete`` as the last event (its stream has no ``[DONE]``).
Either way a failure event is raised as the ``APIStatusError`` of its code (500
when it names none); events of a type stormguard does not know are handed on
like the others.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .._core.exceptions import APIError, APIResponseValidationError
from .._core.record_shapes import Shape, misfit
from .._io.decoding import error_from_payload, parse_json_object
from .._io.sse import ServerSentEvent
from ..protocol import parse_non_negative_int
from .stream_core import StreamCore, T

__all__ = [
    "RESPONSE_ENDS",
    "RESPONSE_FAILURES",
    "StreamEvents",
    "is_done",
    "names_error",
    "response_event_type",
    "response_failure",
    "response_failure_status",
]


def is_done(event: ServerSentEvent) -> bool:
    return event.data.strip() == "[DONE]"


def names_error(event: ServerSentEvent, payload: Mapping[str, Any]) -> bool:
    """An error sent inside a 200 stream: vLLM's shape, or an ``error`` event."""
    return event.event == "error" or "error" in payload


#: The Responses API's last events: the stream ends with the one that comes.
RESPONSE_ENDS = frozenset({"response.completed", "response.incomplete"})
RESPONSE_FAILURES = frozenset({"error", "response.failed"})
#: Codes of a Responses API failure event that name a status (others are a 500).
_RESPONSE_ERROR_STATUS = {"rate_limit_exceeded": 429, "server_error": 500}


def response_event_type(event: ServerSentEvent, payload: Mapping[str, Any]) -> str | None:
    kind = payload.get("type", event.event)
    return kind if isinstance(kind, str) else event.event


def response_failure(kind: str, payload: Mapping[str, Any]) -> dict[str, Any]:
    """The error of a Responses API failure event in the shape of an error body: an
    ``error`` event carries ``code``/``message``/``param`` itself, ``response.failed``
    in ``response.error``."""
    if kind == "response.failed":
        response = payload.get("response")
        error = response.get("error") if isinstance(response, Mapping) else None
        found = dict(error) if isinstance(error, Mapping) else {}
        found.setdefault("message", "The response failed")
    else:
        found = {k: payload[k] for k in ("code", "message", "param") if k in payload}
    return {"error": found}


def response_failure_status(body: Mapping[str, Any]) -> int | None:
    code = body["error"].get("code")
    return _RESPONSE_ERROR_STATUS.get(code) if isinstance(code, str) else None


class StreamEvents(StreamCore[T]):
    """Reads one event into a chunk for the caller, the end, or the error it sends."""

    def _event(self, event: ServerSentEvent) -> APIError | None:
        data = event.data
        if data[:1] != "{" and is_done(event):  # a chunk is an object: skip the strip
            self.done = True
            return None
        payload = parse_json_object(data)
        if payload is None:
            return APIResponseValidationError(
                f"A stream event is not a JSON object: {self.call.redactor.quote(data, 80)!r}",
                status_code=self.response.status_code,
                server_load=self.call.server_load,
                request_id=self.info.request_id,
            )
        if self.responses_api:
            return self._response_event(event, payload)
        if "error" in payload or event.event == "error":  # ``names_error``, inline
            return self._error_event(payload)
        check = self.chunk_check
        if check is not None and not check.fits(data, payload):
            return self._misfit(check.shape, payload)
        usage = payload.get("usage")
        if isinstance(usage, dict):
            self.usage = usage
        choices = payload.get("choices")
        if type(choices) is list:
            # A choice with a finish reason is rare (its last chunk): only then is
            # ``note_finishes`` called, 0.2 us a chunk less.
            for choice in choices:
                if type(choice) is dict and choice.get("finish_reason") is not None:
                    self.note_finishes(choices)
                    break
        self.pending.append(self.chunk_type(payload))
        return None

    def _response_event(
        self, event: ServerSentEvent, payload: Mapping[str, Any]
    ) -> APIError | None:
        """One Responses API event: a failure is an error; the usage and status of the
        response it carries are noted; the last event ends the stream."""
        kind = response_event_type(event, payload)
        if kind in RESPONSE_FAILURES or event.event == "error":
            failure = response_failure(kind or "error", payload)
            return self._error_event(failure, response_failure_status(failure))
        check = self.chunk_check
        if check is not None and not check.fits(event.data, payload):
            return self._misfit(check.shape, payload)
        response = payload.get("response")
        if isinstance(response, Mapping):
            usage = response.get("usage")
            if isinstance(usage, Mapping):
                self.usage = {
                    "prompt_tokens": usage.get("input_tokens"),
                    "completion_tokens": usage.get("output_tokens"),
                    "total_tokens": usage.get("total_tokens"),
                }
            status = response.get("status")
            if kind in RESPONSE_ENDS and isinstance(status, str):
                self.finish_reasons.append(status)
        self.pending.append(self.chunk_type(payload))
        if kind in RESPONSE_ENDS:
            self.done = True
        return None

    def _misfit(self, shape: Shape, payload: Mapping[str, Any]) -> APIError:
        """The error of an event whose fields its chunk type cannot serve (the
        message says which, and how)."""
        problem = misfit(shape, payload)
        return APIResponseValidationError(
            f"A stream event does not fit {self.chunk_type.__name__}: {problem}",
            status_code=self.response.status_code,
            server_load=self.call.server_load,
            request_id=self.info.request_id,
        )

    def _error_event(self, payload: Any, status: int | None = None) -> APIError:
        """An error sent inside a 200 stream (vLLM does this when it sheds a streaming
        request): the error class of ``status``, else of the code it names, else 500."""
        error = payload.get("error")
        code = error.get("code") if isinstance(error, dict) else None
        if isinstance(code, str):
            number = parse_non_negative_int(code)
            code = code if number is None else number
        if status is None:
            status = code if isinstance(code, int) and 400 <= code <= 599 else 500
        return error_from_payload(
            status,
            payload,
            server_load=self.call.server_load,
            request_id=self.info.request_id,
            response=self.response,
            redactor=self.call.redactor,
        )
