"""One request to the engine, from parsed body to HTTP response, for every API.

The flow reads top to bottom: size the request and refuse what can never fit
-> charge it to its API key's quota, when one is set (quota/buckets.py: a 429 there costs
nothing and is no request record) -> announce it to the observers -> wait for
admission (shed, expired or disconnected requests stop here and never reach the
engine) -> run it in the engine, racing the client's disconnect, with what is left
of its deadline (the engine aborts it when that passes: a 504, or an error event in
the stream) -> answer as JSON or as an SSE stream, in the shape of the request's API (its
``answer.Answer``: chat, completions, embeddings, Responses).
However it ends, ``_Flight.end`` runs exactly once: it releases the
admission grant and hands the finished ``RequestRecord`` to the observers.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from fastapi.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from stormguard.protocol import (
    HEADER_REQUEST_ID,
    HEADER_SHOULD_RETRY,
    Priority,
    parse_attempt,
    parse_deadline_ms,
    parse_priority,
)
from stormguard_server.admission.tickets import Grant, Shed, ShedError
from stormguard_server.api.answer import Answer, Output, SlowAnswer, StreamAnswer
from stormguard_server.engine.base import (
    DeadlineExceeded,
    EngineError,
    GenerationRequest,
    TokenDelta,
)
from stormguard_server.http import sse
from stormguard_server.http.disconnect import ClientGone, unless_disconnected
from stormguard_server.http.errors import error_response
from stormguard_server.http.json_response import JSONResponse
from stormguard_server.http.refusals import (
    engine_error_code,
    engine_error_status,
    refusal_headers,
    shed_error_response,
    too_long_refusal,
)
from stormguard_server.quota.buckets import key_label
from stormguard_server.quota.http import quota_refusal_response
from stormguard_server.state import ServerState
from stormguard_server.telemetry.records import GoneStage, Outcome, RequestRecord

# Status for a request whose client has gone: never delivered, only logged and counted.
_CLIENT_CLOSED = 499

RequestKind = Literal["chat", "completion", "embedding", "response"]
# The prefix of each kind's ids, as OpenAI's (x-request-id, records, logs).
_ID_PREFIX: dict[RequestKind, str] = {
    "chat": "chatcmpl",
    "completion": "cmpl",
    "embedding": "embd",
    "response": "resp",
}


@dataclass(frozen=True, slots=True)
class GenerationCall:
    """A validated request for the engine, with its wire-protocol headers parsed.

    ``max_tokens`` is 0 for a prefill-only request (embeddings): it costs its
    prompt tokens alone, and the engine runs only the prefill (``_engine_request``).
    ``stream`` is the writer of its SSE events when the answer is streamed.
    ``quota_key`` is the label of the API key it is charged to, ``quota_tokens`` what
    it is charged (quota/buckets.py)."""

    kind: RequestKind
    model: str
    prompt: str
    prompt_tokens: int
    max_tokens: int
    stop: tuple[str, ...]
    ignore_eos: bool
    answer: Answer
    stream: StreamAnswer | None
    priority: Priority
    attempt: int | None
    deadline_ms: float | None
    quota_key: str
    quota_tokens: int
    script: tuple[str, ...] | None = None  # a decided answer's tokens (structured.py)

    @property
    def cost(self) -> int:
        """Admission cost: prompt tokens + max_tokens, the KV tokens the request may hold."""
        return self.prompt_tokens + self.max_tokens


def size_call(
    state: ServerState,
    *,
    kind: RequestKind,
    model: str,
    prompt: str,
    requested_max_tokens: int | None,
    stop: tuple[str, ...],
    ignore_eos: bool,
    answer: Answer,
    stream: StreamAnswer | None,
    headers: Mapping[str, str],
    prompt_param: str = "messages",
    script: tuple[str, ...] | None = None,
) -> GenerationCall | Response:
    """Count the prompt and fix max_tokens; a request over the context is a 400 too_long
    (naming ``prompt_param``, the field that holds the prompt). A ``script`` (a JSON
    document, tool-call arguments) is what the engine will emit; ``stop`` strings do
    not cut it."""
    engine = state.engine
    prompt_tokens = len(engine.encode(prompt))
    limit = engine.max_model_len
    max_tokens = requested_max_tokens or max(1, limit - prompt_tokens)
    if prompt_tokens + max_tokens > limit:
        return too_long_response(
            state,
            f"This model's maximum context length is {limit} tokens. However, you requested "
            f"{prompt_tokens + max_tokens} tokens ({prompt_tokens} in the messages, "
            f"{max_tokens} in the completion). Please reduce the length of the messages or "
            "completion.",
            param=prompt_param,
        )
    return GenerationCall(
        kind=kind,
        model=model,
        prompt=prompt,
        prompt_tokens=prompt_tokens,
        max_tokens=max_tokens,
        stop=() if script is not None else stop,
        ignore_eos=ignore_eos,
        answer=answer,
        stream=stream,
        script=script,
        quota_tokens=prompt_tokens
        + (
            state.config.quota.default_max_tokens
            if requested_max_tokens is None
            else requested_max_tokens
        ),
        **_wire_headers(headers),
    )


def prefill_call(
    *,
    kind: RequestKind,
    model: str,
    prompt: str,
    prompt_tokens: int,
    answer: Answer,
    headers: Mapping[str, str],
) -> GenerationCall:
    """A request whose engine work is the prefill of ``prompt_tokens`` alone (embeddings):
    admitted at that cost, never streamed. The caller has checked its inputs' lengths."""
    return GenerationCall(
        kind=kind,
        model=model,
        prompt=prompt,
        prompt_tokens=prompt_tokens,
        max_tokens=0,
        stop=(),
        ignore_eos=True,
        answer=answer,
        stream=None,
        quota_tokens=prompt_tokens,
        **_wire_headers(headers),
    )


def _wire_headers(headers: Mapping[str, str]) -> dict[str, Any]:
    return {
        "priority": parse_priority(headers),
        "attempt": parse_attempt(headers),
        "deadline_ms": parse_deadline_ms(headers),
        "quota_key": key_label(headers),
    }


def _engine_request(
    call: GenerationCall, request_id: str, timeout_s: float | None
) -> GenerationRequest:
    """The engine's work for ``call``. A prefill-only call asks for one token: an engine
    samples it in the step that completes the prefill, so the request ends there (no
    decode step) and its KV blocks are freed; the token is not part of the answer."""
    return GenerationRequest(
        request_id=request_id,
        prompt=call.prompt,
        prompt_tokens=call.prompt_tokens,
        max_tokens=call.max_tokens or 1,
        stop=call.stop,
        ignore_eos=call.ignore_eos,
        timeout_s=timeout_s,
        script=call.script,
    )


class _Flight:
    """One request in progress: its record, its output so far, its admission grant.
    Its times are read on the server's clock (``state.clock``)."""

    def __init__(self, state: ServerState, call: GenerationCall) -> None:
        self.state = state
        self.call = call
        self.record = RequestRecord(
            request_id=f"{_ID_PREFIX[call.kind]}-{uuid.uuid4().hex}",
            kind=call.kind,
            model=call.model,
            priority=call.priority,
            attempt=call.attempt,
            deadline_ms=call.deadline_ms,
            prompt_tokens=call.prompt_tokens,
            max_tokens=call.max_tokens,
            arrival=state.clock.now(),
        )
        self.text: list[str] = []
        self.grant: Grant | None = None
        self._ended = False

    @property
    def request_id(self) -> str:
        return self.record.request_id

    def time_left_s(self) -> float | None:
        """Seconds until the caller's deadline (negative once passed); None without one."""
        if self.call.deadline_ms is None:
            return None
        return self.call.deadline_ms / 1000.0 - (self.state.clock.now() - self.record.arrival)

    def output(self) -> Output:
        """What the engine did so far, for the answer's writer."""
        record = self.record
        return Output(
            request_id=record.request_id,
            model=self.call.model,
            prompt_tokens=self.call.prompt_tokens,
            text="".join(self.text),
            output_tokens=record.output_tokens,
            finish_reason=record.finish_reason,
        )

    def failed(self, error: EngineError) -> None:
        """End the flight for an engine error."""
        expired = isinstance(error, DeadlineExceeded)
        self.end("deadline_exceeded" if expired else "engine_error", error=str(error))

    def took(self, delta: TokenDelta) -> None:
        """Note one delta from the engine (for a prefill-only call, only that it ended:
        the token sampled at the end of its prefill is no output)."""
        if self.call.max_tokens == 0:
            delta = TokenDelta(text="", output_tokens=0, finish_reason=delta.finish_reason)
        record = self.record
        if record.first_token_at is None:
            record.first_token_at = self.state.clock.now()
        self.text.append(delta.text)
        record.output_tokens = delta.output_tokens
        record.finish_reason = delta.finish_reason
        if delta.finish_reason is not None:
            record.finished_at = self.state.clock.now()

    def end(self, outcome: Outcome, *, gone: GoneStage | None = None, error: str = "") -> None:
        """Release the admission grant and tell the observers; only the first call counts."""
        if self._ended:
            return
        self._ended = True
        if gone == "running":
            self.state.engine.abort(self.request_id)  # takes effect at the next engine step
        if self.grant is not None and self.state.admission is not None:
            # A request the engine failed tells nothing about how long requests hold
            # their tokens (the wait estimate); one whose caller left or whose
            # deadline passed does: that is when its tokens came back.
            self.state.admission.release(self.grant, served=outcome != "engine_error")
        self.record.outcome = outcome
        self.record.gone_stage = gone
        self.record.error = error or None
        for observer in self.state.observers:
            observer.request_done(self.record)


async def serve_generation(state: ServerState, call: GenerationCall, receive: Receive) -> Response:
    """Admit, generate and answer one request (see the module docstring). Every answer
    carries ``x-request-id``: the completion's id, also in the logs and records."""
    if state.quota is not None:
        refusal = state.quota.charge(call.quota_key, call.quota_tokens)
        if refusal is not None:
            return quota_refusal_response(
                state.quota, refusal, model=call.model, key=call.quota_key
            )
    flight = _Flight(state, call)
    response = await _serve(flight, receive)
    response.headers[HEADER_REQUEST_ID] = flight.request_id
    return response


async def _serve(flight: _Flight, receive: Receive) -> Response:
    state, call = flight.state, flight.call
    record = flight.record
    for observer in state.observers:
        observer.request_arrived(record)

    if state.admission is not None:
        ticket = state.admission.make_ticket(
            call.cost,
            priority=call.priority,
            attempt=call.attempt or 1,
            deadline_ms=call.deadline_ms,
            max_tokens=call.max_tokens,
        )
        record.cost = ticket.cost
        try:
            flight.grant = await unless_disconnected(receive, state.admission.acquire(ticket))
        except ShedError as exc:
            record.shed_reason = exc.shed.reason
            record.queue_position = ticket.queue_position
            flight.end("shed", error=exc.shed.message)
            return shed_response(state, exc.shed)
        except ClientGone:
            record.queue_position = ticket.queue_position
            flight.end("client_gone", gone="queued")
            return Response(status_code=_CLIENT_CLOSED)
        record.queue_position = ticket.queue_position
        record.admitted_at = ticket.admitted_at

    deltas = state.engine.generate(_engine_request(call, flight.request_id, flight.time_left_s()))
    record.started = True
    try:
        if call.stream is not None:
            first = await unless_disconnected(receive, _next_delta(deltas, flight))
        else:
            await unless_disconnected(receive, _drain(deltas, flight))
    except ClientGone:
        flight.end("client_gone", gone="running")
        return Response(status_code=_CLIENT_CLOSED)
    except EngineError as exc:
        flight.failed(exc)
        return engine_error_response(state, exc)
    except BaseException as exc:
        flight.end("engine_error", error=repr(exc))
        raise

    if call.stream is None:
        flight.end("ok")
        if isinstance(call.answer, SlowAnswer):  # the event loop keeps serving meanwhile
            content = await asyncio.to_thread(call.answer.render, flight.output())
            return Response(content, media_type="application/json")
        return JSONResponse(call.answer.body(flight.output()))
    return _GuardedStream(
        _stream_events(flight, call.stream, deltas, first),
        on_close=lambda: flight.end("client_gone", gone="running"),
        media_type=sse.MEDIA_TYPE,
        headers=sse.HEADERS,
    )


async def _next_delta(deltas: AsyncIterator[TokenDelta], flight: _Flight) -> TokenDelta:
    delta = await deltas.__anext__()
    flight.took(delta)
    return delta


async def _drain(deltas: AsyncIterator[TokenDelta], flight: _Flight) -> None:
    async for delta in deltas:
        flight.took(delta)


async def _stream_events(
    flight: _Flight, writer: StreamAnswer, deltas: AsyncIterator[TokenDelta], first: TokenDelta
) -> AsyncIterator[bytes]:
    """The SSE body. Ending normally or with an engine error ends the flight here; if
    the client leaves first, the response's ``on_close`` ends it as client_gone."""
    for event in writer.opening(flight.output()):
        yield event
    for event in writer.delta(first, first=True):
        yield event
    try:
        if first.finish_reason is None:
            async for delta in deltas:
                flight.took(delta)
                for event in writer.delta(delta, first=False):
                    yield event
    except EngineError as exc:
        flight.failed(exc)
        failed = writer.failed(
            flight.output(),
            status=engine_error_status(exc),
            code=engine_error_code(exc),
            message=str(exc),
        )
        for event in failed:
            yield event
        return
    flight.end("ok")
    for event in writer.closing(flight.output()):
        yield event


class _GuardedStream(StreamingResponse):
    """A streaming response that always runs ``on_close``, even if it never starts
    (client gone before the first byte) or is cancelled mid-stream."""

    def __init__(
        self, content: AsyncIterator[bytes], *, on_close: Callable[[], None], **kwargs: Any
    ) -> None:
        super().__init__(content, **kwargs)
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._on_close()


# The refusals of the reference app, which reads admission from its ServerState; the
# status, body and headers of each are http/refusals.py's, shared with the vLLM middleware.


def too_long_response(state: ServerState, message: str, *, param: str = "messages") -> Response:
    """``too_long_refusal`` of the reference app (its load headers only when admission
    is on)."""
    return too_long_refusal(message, param=param, admission=state.admission is not None)


def shed_response(state: ServerState, shed: Shed) -> Response:
    """A refusal from admission, with its reason, Retry-After and x-should-retry."""
    return shed_error_response(shed)


def engine_error_response(state: ServerState, error: EngineError) -> Response:
    """An engine failure (``engine_error_status``). A 503 says when the engine is back;
    a 504 says that retrying cannot help: the caller's own deadline has passed."""
    status = engine_error_status(error)
    headers: dict[str, str] = {}
    if status == 503:
        if state.admission is not None:
            shed = state.admission.unready_shed(state.engine.load())
            headers = refusal_headers(shed.reason, shed.retry_after_s, shed.should_retry)
        return error_response(503, str(error), code=engine_error_code(error), headers=headers)
    if status == 504:
        if state.admission is not None:
            headers = {HEADER_SHOULD_RETRY: "false"}
        return error_response(504, str(error), code=engine_error_code(error), headers=headers)
    return error_response(500, str(error), code=engine_error_code(error))
