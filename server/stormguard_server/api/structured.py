"""Tools and structured output: what a request asks of its answer, checked, and what
the answer will be, decided before the engine runs.

A request's ``tools``, ``tool_choice``, ``parallel_tool_calls`` and
``response_format`` (chat) or ``text.format`` (Responses) become an ``OutputSpec``
(each checked: a 400 ``Refused`` names the field), then one ``Plan`` per request:

* **tool calls** when there are tools and ``tool_choice`` is not ``none``: with
  ``auto`` unless the conversation's last turn is a tool's result (a ``tool``
  message, a ``function_call_output`` item), so an agent loop ends on the next
  turn; with ``required`` always; with a named function, one call to it. The
  tools called are those whose name the last user message mentions, in the
  order of ``tools``, or the first tool when it mentions none; with
  ``parallel_tool_calls: false``, only the first of them. Each call's arguments
  are a document valid for its ``parameters`` (``schema_values.py``).
* otherwise **a JSON document** for ``json_object`` or ``json_schema``;
* otherwise **text**, the engine's own words.

A plan's text (a document, or the calls' arguments one after the other) is the
engine's ``script``: the engine emits it token by token, so it is generated, timed,
counted in usage and cut by ``max_tokens`` like any answer.
"""

from __future__ import annotations

import asyncio
import json
import re
import uuid
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from stormguard_server.api.schema_check import CheckedSchema, SchemaRefused, check_schema
from stormguard_server.api.schema_values import document
from stormguard_server.engine.tokenizer import split_tokens

MAX_TOOLS = 128
NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
NO_PARAMETERS = check_schema({"type": "object", "properties": {}}, strict=False)
_ANY_OBJECT = check_schema(
    {
        "type": "object",
        "properties": {"answer": {"type": "string", "minLength": 1}},
        "required": ["answer"],
        "additionalProperties": False,
    },
    strict=True,
)

T = TypeVar("T")
Format = Literal["text", "json_object", "json_schema"]
Mode = Literal["none", "auto", "required", "named"]


class Refused(Exception):
    """A request's tools or format this server will not answer: a 400 naming ``param``."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.message, self.param = message, param


@dataclass(frozen=True, slots=True)
class Tool:
    """A function tool, its parameters checked. ``definition`` is as the request gave it
    (the prompt shows it to the model; the Responses API echoes it)."""

    name: str
    parameters: CheckedSchema
    definition: dict[str, Any]
    param: str  # where its parameters sit in the request, for a 400


@dataclass(frozen=True, slots=True)
class OutputSpec:
    """What one request asks of its answer."""

    tools: tuple[Tool, ...] = ()
    mode: Mode = "auto"
    forced: str | None = None
    parallel: bool = True
    format: Format = "text"
    schema: CheckedSchema | None = None
    schema_subject: str = ""  # "response_format 'Name'", for a 400
    schema_param: str = "response_format"

    def prompt_lines(self) -> list[tuple[str, str]]:
        """The tools, as a turn of the prompt: they cost prompt tokens, as a chat
        template that lists them does."""
        if not self.tools:
            return []
        shown = [json.dumps(tool.definition, ensure_ascii=False) for tool in self.tools]
        return [("tools", "\n".join(shown))]


@dataclass(frozen=True, slots=True)
class ToolCall:
    call_id: str
    item_id: str
    name: str
    arguments: str


@dataclass(frozen=True, slots=True)
class Plan:
    """One request's answer, decided: tool calls, a JSON document, or (neither) text."""

    calls: tuple[ToolCall, ...] = ()
    document: str | None = None

    @property
    def script(self) -> tuple[str, ...] | None:
        """The answer's tokens for the engine; None for the engine's own text."""
        if self.calls:
            return tuple(piece for call in self.calls for piece in split_tokens(call.arguments))
        if self.document is not None:
            return tuple(split_tokens(self.document))
        return None

    def calls_in(self, text: str) -> list[tuple[ToolCall, str]]:
        """The calls ``text`` (the script emitted so far) has begun, each with the
        arguments it holds so far."""
        started, start = [], 0
        for call in self.calls:
            if start >= len(text):
                break
            started.append((call, text[start : start + len(call.arguments)]))
            start += len(call.arguments)
        return started


class CallCursor:
    """Follows a stream of script text through the calls it spells: which call each
    fragment belongs to, and whether the fragment begins it."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.offset = 0

    def advance(self, text: str) -> list[tuple[int, str, bool]]:
        """(call index, fragment of its arguments, first fragment of that call)."""
        out, start, end = [], 0, self.offset + len(text)
        for index, call in enumerate(self.plan.calls):
            stop = start + len(call.arguments)
            low, high = max(start, self.offset), min(stop, end)
            if low < high:
                out.append((index, text[low - self.offset : high - self.offset], low == start))
            start = stop
        self.offset = end
        return out


async def off_the_loop(decide: Callable[[], T], *, heavy: bool) -> T:
    """Run ``decide`` in a worker thread when the request has tools or a format: a
    schema of 5,000 properties takes ~60 ms to check and answer, which the event
    loop should not be held for; a plain request does it inline (no thread hop)."""
    return await asyncio.to_thread(decide) if heavy else decide()


def seed_of(prompt: str, base: int) -> int:
    """A decided answer's seed: its prompt's, as the sim engine seeds its own words."""
    return zlib.crc32(prompt.encode("utf-8", "surrogatepass")) ^ base


def plan(spec: OutputSpec, *, last_role: str, user_text: str, seed: int) -> Plan:
    """The answer to a request asking ``spec``, whose last turn is ``last_role``'s and
    whose last user message says ``user_text`` (see the module docstring). A schema
    no document can be drawn for within the bounds is refused here, as its field."""
    calling = spec.tools and (
        spec.mode in ("required", "named") or (spec.mode == "auto" and last_role != "tool")
    )
    if calling:
        chosen = _chosen_tools(spec, user_text)
        return Plan(calls=tuple(_call(tool, seed, i) for i, tool in enumerate(chosen)))
    if spec.format == "text":
        return Plan()
    try:
        return Plan(document=document(spec.schema or _ANY_OBJECT, seed))
    except SchemaRefused as exc:
        raise Refused(exc.message(spec.schema_subject), spec.schema_param) from None


def _chosen_tools(spec: OutputSpec, user_text: str) -> list[Tool]:
    if spec.mode == "named":
        return [tool for tool in spec.tools if tool.name == spec.forced][:1]
    mentioned = [tool for tool in spec.tools if _mentions(user_text, tool.name)]
    chosen = mentioned or list(spec.tools[:1])
    return chosen if spec.parallel else chosen[:1]


def _mentions(text: str, name: str) -> bool:
    return re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", text) is not None


def _call(tool: Tool, seed: int, index: int) -> ToolCall:
    try:
        arguments = document(tool.parameters, zlib.crc32(f"{seed}:{index}:{tool.name}".encode()))
    except SchemaRefused as exc:
        raise Refused(exc.message(f"function '{tool.name}'"), tool.param) from None
    hexa = uuid.uuid4().hex
    return ToolCall(
        call_id=f"call_{hexa[:24]}", item_id=f"fc_{hexa}", name=tool.name, arguments=arguments
    )
