"""The OpenAI response shapes of the two choice-based APIs: full completions,
stream chunks, usage.

Pure functions from what was generated to the JSON the openai package parses
(``chat.completion``, ``chat.completion.chunk``, ``text_completion``), and
``ChoicesAnswer``, which writes them for the generation flow. A chat answer that
calls tools (``structured.Plan``) has ``content: null`` and ``tool_calls``, and
``finish_reason: "tool_calls"`` once every call is whole (``"length"`` when
``max_tokens`` cut one). Streamed, as OpenAI and vLLM stream them: a call's first
fragment comes with its ``index``, ``id``, ``type`` and function ``name``, the
later ones with ``index`` and an ``arguments`` fragment alone, and the
``finish_reason`` in a chunk of its own with an empty delta.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Literal

from stormguard_server.api.answer import Output
from stormguard_server.api.structured import CallCursor, Plan, ToolCall
from stormguard_server.engine.base import TokenDelta
from stormguard_server.http import sse
from stormguard_server.http.errors import error_body

Kind = Literal["chat", "completion"]


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def full_response(
    kind: Kind,
    *,
    request_id: str,
    model: str,
    text: str,
    finish_reason: str | None,
    prompt_tokens: int,
    completion_tokens: int,
) -> dict[str, Any]:
    """A non-streaming answer."""
    choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": finish_reason}
    if kind == "chat":
        choice["message"] = {"role": "assistant", "content": text}
    else:
        choice["text"] = text
    return {
        "id": request_id,
        "object": "chat.completion" if kind == "chat" else "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
        "usage": usage(prompt_tokens, completion_tokens),
    }


def chunk(
    kind: Kind,
    *,
    request_id: str,
    model: str,
    created: int,
    choices: list[dict[str, Any]],
    include_usage: bool,
) -> dict[str, Any]:
    """One stream chunk; with include_usage every chunk has ``"usage": null``."""
    body: dict[str, Any] = {
        "id": request_id,
        "object": "chat.completion.chunk" if kind == "chat" else "text_completion",
        "created": created,
        "model": model,
        "choices": choices,
    }
    if include_usage:
        body["usage"] = None
    return body


def delta_choice(kind: Kind, delta: TokenDelta, *, first: bool) -> dict[str, Any]:
    """The choice of a chunk carrying ``delta``; the first chat chunk names the role."""
    choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": delta.finish_reason}
    if kind == "chat":
        content: dict[str, Any] = {"content": delta.text}
        if first:
            content = {"role": "assistant", **content}
        choice["delta"] = content
    else:
        choice["text"] = delta.text
    return choice


def tool_call(call: ToolCall, arguments: str) -> dict[str, Any]:
    """A chat message's tool call, with the ``arguments`` emitted so far."""
    return {
        "id": call.call_id,
        "type": "function",
        "function": {"name": call.name, "arguments": arguments},
    }


def calls_finish_reason(finish_reason: str | None) -> str | None:
    """A plan of tool calls that ran to its end finished by calling them."""
    return "tool_calls" if finish_reason == "stop" else finish_reason


@dataclass
class ChoicesAnswer:
    """Chat and text completions, as JSON or as chunks ending in ``data: [DONE]``."""

    kind: Kind
    include_usage: bool = False
    plan: Plan = field(default_factory=Plan)
    created: int = field(default_factory=lambda: int(time.time()))
    _request_id: str = ""
    _model: str = ""
    _cursor: CallCursor = field(init=False)

    def __post_init__(self) -> None:
        self._cursor = CallCursor(self.plan)

    def body(self, out: Output) -> dict[str, Any]:
        body = full_response(
            self.kind,
            request_id=out.request_id,
            model=out.model,
            text=out.text,
            finish_reason=out.finish_reason,
            prompt_tokens=out.prompt_tokens,
            completion_tokens=out.output_tokens,
        )
        if self.plan.calls:
            choice = body["choices"][0]
            choice["message"]["content"] = None
            choice["message"]["tool_calls"] = [
                tool_call(call, arguments) for call, arguments in self.plan.calls_in(out.text)
            ]
            choice["finish_reason"] = calls_finish_reason(out.finish_reason)
        return body

    def opening(self, out: Output) -> list[bytes]:
        self._request_id, self._model = out.request_id, out.model
        return []

    def delta(self, delta: TokenDelta, *, first: bool) -> list[bytes]:
        if self.plan.calls:
            return self._calls_delta(delta, first=first)
        return [sse.event(self._chunk([delta_choice(self.kind, delta, first=first)]))]

    def _calls_delta(self, delta: TokenDelta, *, first: bool) -> list[bytes]:
        entries: list[dict[str, Any]] = []
        for index, fragment, starts in self._cursor.advance(delta.text):
            if starts:
                entry = {"index": index, **tool_call(self.plan.calls[index], fragment)}
            else:
                entry = {"index": index, "function": {"arguments": fragment}}
            entries.append(entry)
        content: dict[str, Any] = {"tool_calls": entries}
        if first:
            content = {"role": "assistant", "content": None, **content}
        events = []
        if entries or first:
            choice = {"index": 0, "logprobs": None, "finish_reason": None, "delta": content}
            events.append(sse.event(self._chunk([choice])))
        if delta.finish_reason is not None:
            finish = calls_finish_reason(delta.finish_reason)
            last: dict[str, Any] = {"index": 0, "logprobs": None, "delta": {}}
            last["finish_reason"] = finish
            events.append(sse.event(self._chunk([last])))
        return events

    def closing(self, out: Output) -> list[bytes]:
        if not self.include_usage:
            return [sse.DONE]
        usage_chunk = self._chunk([])
        usage_chunk["usage"] = usage(out.prompt_tokens, out.output_tokens)
        return [sse.event(usage_chunk), sse.DONE]

    def failed(self, out: Output, *, status: int, code: str, message: str) -> list[bytes]:
        error: dict[str, object] = {**error_body(message, status=status)["error"]}
        error["code"] = status  # vLLM's shape: the HTTP status, as a number, is the code
        return [sse.event({"error": error}), sse.DONE]

    def _chunk(self, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return chunk(
            self.kind,
            request_id=self._request_id,
            model=self._model,
            created=self.created,
            choices=choices,
            include_usage=self.include_usage,
        )
