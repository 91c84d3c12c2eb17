"""The OpenAI response shapes: full completions, stream chunks, usage.

Pure functions from what was generated to the JSON the openai package parses
(``chat.completion``, ``chat.completion.chunk``, ``text_completion``).
"""

from __future__ import annotations

import time
from typing import Any, Literal

from stormguard_server.engine import TokenDelta

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
