"""What the token pre-check reads of each endpoint's body, as a chat or completion body.

The pre-check (``stormguard.tokens``) counts chat messages and completion prompts.
The other endpoints that send a prompt are shown to it in those terms rather
than taught to it one by one:

* ``responses``: ``instructions`` first (as a system message, the order the
  reference server renders them in), then ``input`` (a string is one user
  message; a list of items keeps each message's role and text, and any other
  item, a tool call or its output, counts as its JSON), ``max_output_tokens`` as
  ``max_tokens``, the tools as they are;
* ``embeddings``: each ``input`` (texts or token ids) as a completion prompt
  with no output tokens, so a batch is checked input by input against the window
  (each must fit; the rate limiter is charged its longest, as for a batch of
  completion prompts).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..tokens._request import Kind
    from .call_spec import CallSpec

__all__ = ["precheck_view", "route_of"]

_OPERATION_KINDS: dict[str, Kind] = {"chat": "chat", "text_completion": "completion"}
#: Text parts of the Responses API, counted as chat's text parts.
_TEXT_PARTS = frozenset({"input_text", "output_text", "text"})


def route_of(path: str) -> str:
    """The last segment of a call's path, without its query: ``responses`` for
    ``responses?x=1`` or ``/v1/responses``."""
    return path.split("?", 1)[0].rstrip("/").rsplit("/", 1)[-1]


def precheck_view(spec: CallSpec) -> tuple[Kind, Mapping[str, Any]] | None:
    """The body the pre-check reads for ``spec`` and how (None: nothing to check)."""
    body = spec.body
    if body is None or spec.method != "POST":
        return None
    route = route_of(spec.path)
    if route == "responses" and spec.operation == "chat":
        return "chat", _responses_as_chat(body)
    if route == "embeddings" and spec.operation == "embeddings":
        return "completion", {"prompt": body.get("input"), "max_tokens": 0}
    kind = _OPERATION_KINDS.get(spec.operation)
    return None if kind is None else (kind, body)


def _responses_as_chat(body: Mapping[str, Any]) -> dict[str, Any]:
    messages: list[dict[str, Any]] = []
    instructions = body.get("instructions")
    if isinstance(instructions, str) and instructions:
        messages.append({"role": "system", "content": instructions})
    given = body.get("input")
    if isinstance(given, str):
        messages.append({"role": "user", "content": given})
    elif isinstance(given, list):
        messages.extend(_message_of(item) for item in given if isinstance(item, Mapping))
    view: dict[str, Any] = {"messages": messages, "max_tokens": body.get("max_output_tokens")}
    if isinstance(body.get("tools"), list):
        view["tools"] = body["tools"]
    return view


def _message_of(item: Mapping[str, Any]) -> dict[str, Any]:
    role = item.get("role")
    if not isinstance(role, str):  # a tool call, its output, a reasoning item ...
        return {"role": "tool", "content": json.dumps(item, separators=(",", ":"), default=str)}
    content = item.get("content")
    if isinstance(content, list):
        content = [
            {"type": "text", "text": part["text"]}
            if isinstance(part, Mapping)
            and part.get("type") in _TEXT_PARTS
            and isinstance(part.get("text"), str)
            else part
            for part in content
        ]
    return {"role": role, "content": content}
