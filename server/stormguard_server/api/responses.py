"""``POST /v1/responses``: the Responses API, text in and text out, under the chat
route's admission (the conversation is rendered with the chat template and sized,
admitted and generated exactly as a chat completion; ``max_output_tokens`` is its
``max_tokens``).

``ResponsesAnswer`` writes the ``response`` object, or the stream's events in the
order openai sends them, each with ``type`` and ``sequence_number``:
``response.created``, ``response.in_progress``, ``response.output_item.added``,
``response.content_part.added``, ``response.output_text.delta`` per delta, then
``response.output_text.done``, ``response.content_part.done``,
``response.output_item.done`` and ``response.completed`` (``response.incomplete``,
with ``incomplete_details.reason = "max_output_tokens"``, when the output was cut
at that limit). An engine failure after the stream began ends it with an ``error``
event (its ``code`` the status the chat route's answer would have, as digits) and then
``response.failed``.
No ``data: [DONE]``: the Responses API's streams end with the connection.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from fastapi.responses import Response
from starlette.types import Receive

from stormguard_server.api.answer import Output
from stormguard_server.api.generation import serve_generation, size_call
from stormguard_server.api.schemas import ResponsesRequest
from stormguard_server.api.structured import (
    CallCursor,
    Plan,
    Refused,
    ToolCall,
    off_the_loop,
    seed_of,
)
from stormguard_server.api.structured import plan as decide
from stormguard_server.api.tool_requests import responses_spec, responses_turns
from stormguard_server.engine.base import TokenDelta
from stormguard_server.http import sse
from stormguard_server.http.errors import error_response
from stormguard_server.state import ServerState


async def serve_responses(
    state: ServerState,
    body: ResponsesRequest,
    *,
    model: str,
    headers: Mapping[str, str],
    receive: Receive,
) -> Response:
    """Size, admit, generate and answer one Responses API request."""

    def decided() -> tuple[str, Plan]:
        spec = responses_spec(body)
        prompt = state.engine.chat_prompt(
            [*spec.prompt_lines(), *body.messages()], add_generation_prompt=True
        )
        last_role, user_text = responses_turns(body)
        seed = seed_of(prompt, state.config.engine.seed)
        return prompt, decide(spec, last_role=last_role, user_text=user_text, seed=seed)

    heavy = bool(body.tools) or (body.text is not None and body.text.format is not None)
    try:
        prompt, plan = await off_the_loop(decided, heavy=heavy)
    except Refused as exc:
        return error_response(400, exc.message, code="invalid_request", param=exc.param)
    answer = ResponsesAnswer(
        instructions=body.instructions,
        max_output_tokens=body.max_output_tokens,
        temperature=body.temperature,
        top_p=body.top_p,
        plan=plan,
        echo=_echo(body),
    )
    call = size_call(
        state,
        kind="response",
        model=model,
        prompt=prompt,
        requested_max_tokens=body.max_output_tokens,
        stop=(),
        ignore_eos=body.ignore_eos,
        answer=answer,
        stream=answer if body.stream else None,
        headers=headers,
        prompt_param="input",
        script=plan.script,
    )
    if isinstance(call, Response):
        return call
    return await serve_generation(state, call, receive)


@dataclass
class ResponsesAnswer:
    """One request's ``response`` object or stream events (see the module docstring)."""

    instructions: str | None
    max_output_tokens: int | None
    temperature: float | None
    top_p: float | None
    plan: Plan = field(default_factory=Plan)
    echo: dict[str, Any] = field(default_factory=dict)
    created_at: int = field(default_factory=lambda: int(time.time()))
    message_id: str = field(default_factory=lambda: f"msg_{uuid.uuid4().hex}")
    _sequence: int = 0
    _cursor: CallCursor = field(init=False)

    def __post_init__(self) -> None:
        self._cursor = CallCursor(self.plan)

    # -- JSON ---------------------------------------------------------------

    def body(self, out: Output) -> dict[str, Any]:
        return self._response(out, self._final_status(out), text=out.text)

    # -- SSE ----------------------------------------------------------------

    def opening(self, out: Output) -> list[bytes]:
        started = self._response(out, "in_progress", text=None)
        events = [
            self._event("response.created", response=started),
            self._event("response.in_progress", response=started),
        ]
        if self.plan.calls:  # each call's item opens with its first fragment
            return events
        return [
            *events,
            self._event(
                "response.output_item.added",
                output_index=0,
                item=self._message("in_progress", text=None),
            ),
            self._event(
                "response.content_part.added",
                item_id=self.message_id,
                output_index=0,
                content_index=0,
                part=_output_text(""),
            ),
        ]

    def delta(self, delta: TokenDelta, *, first: bool) -> list[bytes]:
        if self.plan.calls:
            return self._calls_delta(delta.text)
        if not delta.text:
            return []
        return [
            self._event(
                "response.output_text.delta",
                item_id=self.message_id,
                output_index=0,
                content_index=0,
                delta=delta.text,
                logprobs=[],
            )
        ]

    def _calls_delta(self, text: str) -> list[bytes]:
        """A call's item is added with its first fragment, after the one before it is
        done; then its arguments come as deltas."""
        events = []
        for index, fragment, starts in self._cursor.advance(text):
            call = self.plan.calls[index]
            if starts:
                if index > 0:  # the call before is whole
                    before = self.plan.calls[index - 1]
                    events += self._call_done(index - 1, before.arguments, "completed")
                item = _function_call(call, "", "in_progress")
                events.append(
                    self._event("response.output_item.added", output_index=index, item=item)
                )
            events.append(
                self._event(
                    "response.function_call_arguments.delta",
                    item_id=call.item_id,
                    output_index=index,
                    delta=fragment,
                )
            )
        return events

    def _call_done(self, index: int, arguments: str, status: str) -> list[bytes]:
        call = self.plan.calls[index]
        return [
            self._event(
                "response.function_call_arguments.done",
                item_id=call.item_id,
                output_index=index,
                name=call.name,
                arguments=arguments,
            ),
            self._event(
                "response.output_item.done",
                output_index=index,
                item=_function_call(call, arguments, status),
            ),
        ]

    def closing(self, out: Output) -> list[bytes]:
        status, text = self._final_status(out), out.text
        if self.plan.calls:
            started = self.plan.calls_in(text)
            last = len(started) - 1
            done = self._call_done(last, started[last][1], status) if started else []
            return [
                *done,
                self._event(
                    "response.completed" if status == "completed" else "response.incomplete",
                    response=self._response(out, status, text=text),
                ),
            ]
        return [
            self._event(
                "response.output_text.done",
                item_id=self.message_id,
                output_index=0,
                content_index=0,
                text=text,
                logprobs=[],
            ),
            self._event(
                "response.content_part.done",
                item_id=self.message_id,
                output_index=0,
                content_index=0,
                part=_output_text(text),
            ),
            self._event(
                "response.output_item.done", output_index=0, item=self._message(status, text=text)
            ),
            self._event(
                "response.completed" if status == "completed" else "response.incomplete",
                response=self._response(out, status, text=text),
            ),
        ]

    def failed(self, out: Output, *, status: int, code: str, message: str) -> list[bytes]:
        """The ``error`` event's ``code`` is the status the failure would have had as an
        HTTP answer, as digits ("503", "504", "500"): a client reads a status from the
        code alone (openai's event has no other field for it; vLLM's chat streams put
        the status there too), so a restarting engine is a 503, not a 500. The reason
        (``engine_unavailable``, ``deadline_exceeded``, ``engine_error``) leads the
        message; ``response.failed`` carries openai's own ``server_error``."""
        failed = self._response(out, "failed", text=None)
        failed["error"] = {"code": "server_error", "message": message}
        return [
            self._event("error", code=str(status), message=f"{code}: {message}", param=None),
            self._event("response.failed", response=failed),
        ]

    # -- shapes -------------------------------------------------------------

    @staticmethod
    def _final_status(out: Output) -> str:
        return "incomplete" if out.finish_reason == "length" else "completed"

    def _response(self, out: Output, status: str, *, text: str | None) -> dict[str, Any]:
        """The ``response`` object; ``text=None`` while nothing is final (no output, no
        usage yet)."""
        done = text is not None
        return {
            "id": out.request_id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "error": None,
            "incomplete_details": (
                {"reason": "max_output_tokens"} if status == "incomplete" else None
            ),
            "instructions": self.instructions,
            "max_output_tokens": self.max_output_tokens,
            "model": out.model,
            "output": self._output(status, text) if text is not None else [],
            "parallel_tool_calls": True,
            "previous_response_id": None,
            "reasoning": None,
            "store": False,
            "temperature": self.temperature,
            "text": {"format": {"type": "text"}},
            "tool_choice": "auto",
            "tools": [],
            "top_p": self.top_p,
            "truncation": "disabled",
            "usage": _usage(out.prompt_tokens, out.output_tokens) if done else None,
            "metadata": {},
            **self.echo,
        }

    def _output(self, status: str, text: str) -> list[dict[str, Any]]:
        if not self.plan.calls:
            return [self._message(status, text=text)]
        return [
            _function_call(call, arguments, status) for call, arguments in self.plan.calls_in(text)
        ]

    def _message(self, status: str, *, text: str | None) -> dict[str, Any]:
        return {
            "type": "message",
            "id": self.message_id,
            "status": status,
            "role": "assistant",
            "content": [] if text is None else [_output_text(text)],
        }

    def _event(self, kind: str, **fields: Any) -> bytes:
        data = {"type": kind, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        return sse.named_event(kind, data)


def _function_call(call: ToolCall, arguments: str, status: str) -> dict[str, Any]:
    return {
        "type": "function_call",
        "id": call.item_id,
        "call_id": call.call_id,
        "name": call.name,
        "arguments": arguments,
        "status": status,
    }


def _echo(body: ResponsesRequest) -> dict[str, Any]:
    """The request's tools and formats, as the ``response`` object repeats them."""
    echo: dict[str, Any] = {}
    if body.tools:
        echo["tools"] = [
            {"strict": None, "description": None, "parameters": None}
            | tool.model_dump(by_alias=True, exclude_unset=True)
            for tool in body.tools
        ]
    if body.tool_choice is not None:
        choice = body.tool_choice
        echo["tool_choice"] = (
            choice if isinstance(choice, str) else choice.model_dump(exclude_unset=True)
        )
    if body.parallel_tool_calls is not None:
        echo["parallel_tool_calls"] = body.parallel_tool_calls
    if body.text is not None and body.text.format is not None:
        echo["text"] = {"format": body.text.format.model_dump(by_alias=True, exclude_unset=True)}
    return echo


def _output_text(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _usage(input_tokens: int, output_tokens: int) -> dict[str, Any]:
    return {
        "input_tokens": input_tokens,
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": input_tokens + output_tokens,
    }
