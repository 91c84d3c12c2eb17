"""The OpenAI response shapes of the two choice-based APIs: full completions,
stream chunks, usage.

Pure functions from what was generated to the JSON the openai package parses
(``chat.completion``, ``chat.completion.chunk``, ``text_completion``), and
``ChoicesAnswer``, which writes them for the generation flow.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Literal

from stormguard_server import sse
from stormguard_server.answer import Output
from stormguard_server.engine import TokenDelta
from stormguard_server.errors import error_body

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


@dataclass
class ChoicesAnswer:
    """Chat and text completions, as JSON or as chunks ending in ``data: [DONE]``."""

    kind: Kind
    include_usage: bool = False
    created: int = field(default_factory=lambda: int(time.time()))
    _request_id: str = ""
    _model: str = ""

    def body(self, out: Output) -> dict[str, Any]:
        return full_response(
            self.kind,
            request_id=out.request_id,
            model=out.model,
            text=out.text,
            finish_reason=out.finish_reason,
            prompt_tokens=out.prompt_tokens,
            completion_tokens=out.output_tokens,
        )

    def opening(self, out: Output) -> list[bytes]:
        self._request_id, self._model = out.request_id, out.model
        return []

    def delta(self, delta: TokenDelta, *, first: bool) -> list[bytes]:
        return [sse.event(self._chunk([delta_choice(self.kind, delta, first=first)]))]

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
