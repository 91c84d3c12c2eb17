"""What the pre-check reads from a request body: the prompt and max_tokens, nothing else."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from ._counter import Message, TokenCounter, Tool

__all__ = ["Kind", "PromptRequest", "count_prompt", "read_request"]

Kind = Literal["chat", "completion"]


@dataclass(frozen=True)
class PromptRequest:
    """The countable part of a chat or completion body."""

    kind: Kind
    messages: tuple[Message, ...] = ()
    tools: tuple[Tool, ...] = ()
    #: Completion prompts given as text (a batch has several).
    texts: tuple[str, ...] = ()
    #: Lengths of completion prompts given as token ids (exact, no counter needed).
    token_id_lengths: tuple[int, ...] = ()
    max_tokens: int | None = None


def read_request(kind: Kind, body: Mapping[str, Any]) -> PromptRequest:
    """Read ``body`` leniently: a malformed field counts as empty, the server will say why."""
    max_tokens = _non_negative_int(body.get("max_completion_tokens"))
    if max_tokens is None:
        max_tokens = _non_negative_int(body.get("max_tokens"))
    if kind == "chat":
        messages = body.get("messages")
        return PromptRequest(
            kind=kind,
            messages=tuple(m for m in _list(messages) if isinstance(m, Mapping)),
            tools=_tools(body),
            max_tokens=max_tokens,
        )
    texts, lengths = _completion_prompts(body.get("prompt"))
    return PromptRequest(kind=kind, texts=texts, token_id_lengths=lengths, max_tokens=max_tokens)


def count_prompt(counter: TokenCounter, request: PromptRequest) -> int:
    """Prompt tokens of ``request``; a batch of prompts counts as its longest one."""
    if request.kind == "chat":
        return counter.count_messages(request.messages, tools=request.tools)
    counts = [counter.count_text(text) for text in request.texts]
    return max([*counts, *request.token_id_lengths], default=0)


def _tools(body: Mapping[str, Any]) -> tuple[Tool, ...]:
    tools = [t for t in _list(body.get("tools")) if isinstance(t, Mapping)]
    # Legacy "functions" are the same definitions without the {"type": "function"} wrapper.
    tools += [
        {"type": "function", "function": f}
        for f in _list(body.get("functions"))
        if isinstance(f, Mapping)
    ]
    return tuple(tools)


def _completion_prompts(prompt: object) -> tuple[tuple[str, ...], tuple[int, ...]]:
    if isinstance(prompt, str):
        return (prompt,), ()
    items = _list(prompt)
    if items and all(isinstance(i, int) for i in items):
        return (), (len(items),)
    texts = tuple(i for i in items if isinstance(i, str))
    lengths = tuple(len(i) for i in items if isinstance(i, list))
    return texts, lengths


def _list(value: object) -> Sequence[Any]:
    return value if isinstance(value, list) else ()


def _non_negative_int(value: object) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return None
