"""Chat prompt counting by OpenAI's published per-message overhead rules.

The rules are those of OpenAI's cookbook "How to count tokens with tiktoken":
every message costs ``tokens_per_message`` (3) plus the tokens of each of its
values, a ``name`` costs ``tokens_per_name`` (1) more, and the reply is primed
with 3 tokens (``<|start|>assistant<|message|>``). What the cookbook leaves open
is counted so that the result can only grow: non-text values (``tool_calls``,
``function_call``, unknown parts) are counted as their compact JSON, images as the
largest cost a high-detail image can have, and tool definitions as the larger of
the cookbook's formula and their JSON.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ._counter import Message, Tool

__all__ = ["CONSERVATIVE_OVERHEAD", "OPENAI_OVERHEAD", "ChatOverhead", "count_chat_tokens"]

#: gpt-4o high detail: 85 base + 170 per 512px tile, at most 2 x 4 tiles after scaling.
IMAGE_PART_TOKENS = 85 + 170 * 8


@dataclass(frozen=True)
class ChatOverhead:
    """Tokens a chat template adds around messages and tool definitions."""

    tokens_per_message: int = 3
    tokens_per_name: int = 1
    reply_priming: int = 3
    # Cookbook, "counting tokens for chat completions with tool calls": the larger
    # of its gpt-4o (7) and gpt-3.5/gpt-4 (10) values, so one table serves both.
    tokens_per_tool: int = 10
    tools_end: int = 12


#: OpenAI's own chat format (gpt-3.5-turbo-0613 and later, gpt-4*, gpt-4o*, o-series).
OPENAI_OVERHEAD = ChatOverhead()
#: For templates we cannot see (a tokenizer.json has no chat template): Llama 3 adds
#: 4 tokens around each message plus BOS, ChatML 4 to 5, so 8 covers the common ones.
CONSERVATIVE_OVERHEAD = ChatOverhead(tokens_per_message=8, tokens_per_name=2, reply_priming=8)


def count_chat_tokens(
    messages: Sequence[Message],
    count_text: Callable[[str], int],
    *,
    tools: Sequence[Tool] = (),
    overhead: ChatOverhead = OPENAI_OVERHEAD,
) -> int:
    """Prompt tokens of ``messages`` (and ``tools``), each text counted by ``count_text``."""
    total = 0
    for message in messages:
        total += overhead.tokens_per_message
        for key, value in message.items():
            total += _count_value(key, value, count_text)
            if key == "name":
                total += overhead.tokens_per_name
    total += overhead.reply_priming
    if tools:
        total += sum(_count_tool(tool, count_text, overhead) for tool in tools)
        total += overhead.tools_end
    return total


def _count_value(key: str, value: object, count_text: Callable[[str], int]) -> int:
    if value is None:
        return 0
    if isinstance(value, str):
        return count_text(value)
    if key == "content" and isinstance(value, list):
        return sum(_count_part(part, count_text) for part in value)
    return count_text(_compact_json(value))  # tool_calls, function_call, audio...


def _count_part(part: object, count_text: Callable[[str], int]) -> int:
    if isinstance(part, str):
        return count_text(part)
    if isinstance(part, Mapping):
        kind = part.get("type")
        if kind == "text" and isinstance(part.get("text"), str):
            return count_text(part["text"])
        if kind in ("image_url", "input_image", "image"):
            return IMAGE_PART_TOKENS
    return count_text(_compact_json(part))


def _count_tool(tool: Tool, count_text: Callable[[str], int], overhead: ChatOverhead) -> int:
    return overhead.tokens_per_tool + max(
        _cookbook_tool_tokens(tool, count_text), count_text(_compact_json(tool))
    )


def _cookbook_tool_tokens(tool: Tool, count_text: Callable[[str], int]) -> int:
    """The cookbook's formula for one function tool (without its per-tool constant)."""
    function = tool.get("function", tool)
    if not isinstance(function, Mapping):
        return 0
    description = str(function.get("description") or "").removesuffix(".")
    total = count_text(f"{function.get('name', '')}:{description}")
    parameters = function.get("parameters")
    properties = parameters.get("properties") if isinstance(parameters, Mapping) else None
    if not isinstance(properties, Mapping) or not properties:
        return total
    total += 3  # start of the properties
    for key, spec in properties.items():
        spec = spec if isinstance(spec, Mapping) else {}
        total += 3  # each property
        enum = spec.get("enum")
        if isinstance(enum, list):
            total += -3 + sum(3 + count_text(str(item)) for item in enum)
        p_description = str(spec.get("description") or "").removesuffix(".")
        total += count_text(f"{key}:{spec.get('type', '')}:{p_description}")
    return total


def _compact_json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)
