"""One generation request, from parsed body to HTTP response.

The flow reads top to bottom: size the request and refuse what can never fit
-> count the attempt -> wait for admission (shed, expired or disconnected
requests stop here and never reach the engine) -> run it in the engine,
racing the client's disconnect -> answer as JSON or as an SSE stream. The
permit is released exactly once, however the request ends.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from stormguard.protocol import Priority, parse_attempt, parse_deadline_ms, parse_priority
from stormguard_server import sse
from stormguard_server.admission import Permit, ShedError
from stormguard_server.disconnect import ClientGone, unless_disconnected
from stormguard_server.engine import (
    EngineCrashed,
    EngineError,
    EngineUnavailable,
    GenerationRequest,
    TokenDelta,
)
from stormguard_server.errors import error_body
from stormguard_server.metrics import attempt_label
from stormguard_server.refusals import engine_error_response, shed_response, too_long_response
from stormguard_server.state import ServerState

Kind = Literal["chat", "completion"]

# Status for a request whose client has gone: never delivered, only logged and counted.
_CLIENT_CLOSED = 499


@dataclass(frozen=True, slots=True)
class GenerationCall:
    """A validated generation request, with its wire-protocol headers parsed."""

    kind: Kind
    model: str
    prompt: str
    prompt_tokens: int
    max_tokens: int
    stop: tuple[str, ...]
    ignore_eos: bool
    stream: bool
    include_usage: bool
    priority: Priority
    attempt: int | None
    deadline_ms: float | None

    @property
    def cost(self) -> int:
        """Admission cost: prompt tokens + max_tokens (the seed's token_admission_load)."""
        return self.prompt_tokens + self.max_tokens


def size_call(
    state: ServerState,
    *,
    kind: Kind,
    model: str,
    prompt: str,
    requested_max_tokens: int | None,
    stop: tuple[str, ...],
    ignore_eos: bool,
    stream: bool,
    include_usage: bool,
    headers: Mapping[str, str],
) -> GenerationCall | Response:
    """Count the prompt and fix max_tokens; a request over the context is a 400 too_long."""
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
        )
    return GenerationCall(
        kind=kind,
        model=model,
        prompt=prompt,
        prompt_tokens=prompt_tokens,
        max_tokens=max_tokens,
        stop=stop,
        ignore_eos=ignore_eos,
        stream=stream,
        include_usage=include_usage,
        priority=parse_priority(headers),
        attempt=parse_attempt(headers),
        deadline_ms=parse_deadline_ms(headers),
    )


@dataclass
class _Progress:
    """What a request has produced so far (for metrics when it ends early)."""

    arrival: float
    text: list[str] = field(default_factory=list)
    output_tokens: int = 0
    finish_reason: str | None = None
    first_token_at: float | None = None
    failed: bool = False


async def serve_generation(state: ServerState, call: GenerationCall, receive: Receive) -> Response:
    """Admit, generate and answer one request (see the module docstring)."""
    metrics = state.metrics
    progress = _Progress(arrival=time.monotonic())
    metrics.attempts.labels(attempt_label(call.attempt)).inc()

    permit: Permit | None = None
    if state.admission is not None:
        ticket = state.admission.make_ticket(
            call.cost,
            priority=call.priority,
            attempt=call.attempt or 1,
            deadline_ms=call.deadline_ms,
        )
        try:
            permit = await unless_disconnected(receive, state.admission.acquire(ticket))
        except ShedError as exc:
            metrics.shed.labels(exc.shed.reason.value, call.priority.value).inc()
            return shed_response(state, exc.shed)
        except ClientGone:
            metrics.disconnects.labels("queued").inc()
            return Response(status_code=_CLIENT_CLOSED)
        metrics.admitted.labels(call.priority.value).inc()
        metrics.queue_wait.observe(permit.waited_s)

    release = _releaser(state, permit)
    request_id = f"{'chatcmpl' if call.kind == 'chat' else 'cmpl'}-{uuid.uuid4().hex}"
    engine_request = GenerationRequest(
        request_id=request_id,
        prompt=call.prompt,
        prompt_tokens=call.prompt_tokens,
        max_tokens=call.max_tokens,
        stop=call.stop,
        ignore_eos=call.ignore_eos,
    )
    deltas = state.engine.generate(engine_request)
    metrics.prompt_tokens.inc(call.prompt_tokens)
    try:
        if call.stream:
            first = await unless_disconnected(receive, _next_delta(deltas, state, progress))
        else:
            await unless_disconnected(receive, _drain(deltas, state, progress))
    except ClientGone:
        state.engine.abort(request_id)
        _count_gone(state, progress)
        release()
        return Response(status_code=_CLIENT_CLOSED)
    except EngineError as exc:
        release()
        return engine_error_response(state, exc)
    except BaseException:
        release()
        raise

    if not call.stream:
        release()
        _observe_done(state, progress)
        return JSONResponse(_full_body(call, request_id, progress))

    events = _stream_events(state, call, request_id, deltas, first, progress)
    return _GuardedStream(
        events,
        on_close=lambda: _close_stream(state, request_id, progress, release),
        media_type=sse.MEDIA_TYPE,
        headers=sse.HEADERS,
    )


def _releaser(state: ServerState, permit: Permit | None) -> Callable[[], None]:
    released = False

    def release() -> None:
        nonlocal released
        if released or permit is None or state.admission is None:
            return
        released = True
        state.admission.release(permit)

    return release


async def _next_delta(
    deltas: AsyncIterator[TokenDelta], state: ServerState, progress: _Progress
) -> TokenDelta:
    delta = await deltas.__anext__()
    _record(state, progress, delta)
    return delta


async def _drain(
    deltas: AsyncIterator[TokenDelta], state: ServerState, progress: _Progress
) -> None:
    async for delta in deltas:
        _record(state, progress, delta)


def _record(state: ServerState, progress: _Progress, delta: TokenDelta) -> None:
    if progress.first_token_at is None:
        progress.first_token_at = time.monotonic()
        state.metrics.ttft.observe(progress.first_token_at - progress.arrival)
    progress.text.append(delta.text)
    progress.output_tokens = delta.output_tokens
    progress.finish_reason = delta.finish_reason


def _observe_done(state: ServerState, progress: _Progress) -> None:
    state.metrics.output_tokens.inc(progress.output_tokens)
    state.metrics.e2e_latency.observe(time.monotonic() - progress.arrival)


def _count_gone(state: ServerState, progress: _Progress) -> None:
    state.metrics.disconnects.labels("running").inc()
    state.metrics.gone_client_tokens.inc(progress.output_tokens)


def _close_stream(
    state: ServerState, request_id: str, progress: _Progress, release: Callable[[], None]
) -> None:
    """The stream ended: unfinished means the client left (or the engine failed)."""
    if progress.finish_reason is None and not progress.failed:
        state.engine.abort(request_id)  # takes effect at the next engine step
        _count_gone(state, progress)
    release()


def _usage(call: GenerationCall, progress: _Progress) -> dict[str, int]:
    return {
        "prompt_tokens": call.prompt_tokens,
        "completion_tokens": progress.output_tokens,
        "total_tokens": call.prompt_tokens + progress.output_tokens,
    }


def _full_body(call: GenerationCall, request_id: str, progress: _Progress) -> dict[str, Any]:
    text = "".join(progress.text)
    choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": progress.finish_reason}
    if call.kind == "chat":
        choice["message"] = {"role": "assistant", "content": text}
    else:
        choice["text"] = text
    return {
        "id": request_id,
        "object": "chat.completion" if call.kind == "chat" else "text_completion",
        "created": int(time.time()),
        "model": call.model,
        "choices": [choice],
        "usage": _usage(call, progress),
    }


def _chunk(
    call: GenerationCall, request_id: str, created: int, choices: list[dict[str, Any]]
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": request_id,
        "object": "chat.completion.chunk" if call.kind == "chat" else "text_completion",
        "created": created,
        "model": call.model,
        "choices": choices,
    }
    if call.include_usage:
        body["usage"] = None
    return body


def _choice_delta(call: GenerationCall, delta: TokenDelta, first: bool) -> dict[str, Any]:
    choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": delta.finish_reason}
    if call.kind == "chat":
        content: dict[str, Any] = {"content": delta.text}
        if first:
            content = {"role": "assistant", **content}
        choice["delta"] = content
    else:
        choice["text"] = delta.text
    return choice


async def _stream_events(
    state: ServerState,
    call: GenerationCall,
    request_id: str,
    deltas: AsyncIterator[TokenDelta],
    first: TokenDelta,
    progress: _Progress,
) -> AsyncIterator[bytes]:
    created = int(time.time())
    yield sse.event(_chunk(call, request_id, created, [_choice_delta(call, first, True)]))
    try:
        if first.finish_reason is None:
            async for delta in deltas:
                _record(state, progress, delta)
                choice = _choice_delta(call, delta, False)
                yield sse.event(_chunk(call, request_id, created, [choice]))
    except EngineError as exc:
        progress.failed = True
        status = 503 if isinstance(exc, EngineUnavailable | EngineCrashed) else 500
        body = error_body(str(exc), status=status, code="engine_error")
        body["error"]["code"] = str(status)
        yield sse.event(body)
        yield sse.DONE
        return
    _observe_done(state, progress)
    if call.include_usage:
        usage_chunk = _chunk(call, request_id, created, [])
        usage_chunk["usage"] = _usage(call, progress)
        yield sse.event(usage_chunk)
    yield sse.DONE


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
