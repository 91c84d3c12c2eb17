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
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from stormguard_server.schema_check import CheckedSchema, SchemaRefused, check_schema
from stormguard_server.schema_values import document
from stormguard_server.schemas import (
    ChatCompletionRequest,
    ChatMessage,
    ChatNamedToolChoice,
    FunctionCallItem,
    FunctionCallOutputItem,
    InputMessage,
    JSONSchemaFormat,
    ResponsesNamedToolChoice,
    ResponsesRequest,
    TextFormat,
)
from stormguard_server.tokenizer import split_tokens

MAX_TOOLS = 128
_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
_NO_PARAMETERS = check_schema({"type": "object", "properties": {}}, strict=False)
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


# -- from a request's fields to an OutputSpec --------------------------------------


def tool_from(
    *, name: Any, parameters: Any, strict: Any, definition: dict[str, Any], param: str
) -> Tool:
    """One function tool, checked; ``param`` is where it sits (``tools.0.function``)."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise Refused(
            f"Invalid '{param}.name': {name!r}. A function name must be 1 to 64 characters of"
            " a-z, A-Z, 0-9, underscores and dashes.",
            f"{param}.name",
        )
    if parameters is None:
        checked = _NO_PARAMETERS
    else:
        try:
            checked = check_schema(parameters, strict=strict is True)
        except SchemaRefused as exc:
            raise Refused(exc.message(f"function '{name}'"), f"{param}.parameters") from None
    return Tool(name, checked, definition, f"{param}.parameters")


def spec_from(
    *,
    tools: Sequence[Tool],
    choice: Mode | None,
    forced: str | None,
    parallel: bool | None,
    format: Format,
    schema: Any,
    strict: bool,
    format_name: str,
    format_param: str,
) -> OutputSpec:
    """The checked spec: ``choice`` is ``none``/``auto``/``required``, or ``named`` with
    ``forced`` the function's name."""
    if len(tools) > MAX_TOOLS:
        raise Refused(f"'tools' has {len(tools)} tools; at most {MAX_TOOLS}.", "tools")
    names = [tool.name for tool in tools]
    for index, name in enumerate(names):
        if name in names[:index]:
            raise Refused(f"Two tools are named {name!r}; tool names must be unique.", "tools")
    mode: Mode = "auto" if choice is None else choice
    if mode in ("required", "named") and not tools:
        raise Refused(
            f"Invalid value for 'tool_choice': {mode!r} is only allowed when 'tools' are"
            " specified.",
            "tool_choice",
        )
    if mode == "named" and forced not in names:
        raise Refused(
            f"Invalid value for 'tool_choice': no function named {forced!r} in 'tools'.",
            "tool_choice",
        )
    checked = None
    if format == "json_schema" and schema is not None:
        try:
            checked = check_schema(schema, strict=strict)
        except SchemaRefused as exc:
            raise Refused(exc.message(f"response_format '{format_name}'"), format_param) from None
    return OutputSpec(
        tools=tuple(tools),
        mode=mode,
        forced=forced,
        parallel=parallel is not False,
        format=format,
        schema=checked,
        schema_subject=f"response_format '{format_name}'",
        schema_param=format_param,
    )


def chat_spec(body: ChatCompletionRequest) -> OutputSpec:
    """A chat request's ``tools``, ``tool_choice``, ``parallel_tool_calls`` and
    ``response_format``, checked."""
    tools = []
    for index, tool in enumerate(body.tools or ()):
        where = f"tools.{index}"
        if tool.type != "function" or tool.function is None:
            raise Refused(_not_a_function(tool.type, where), f"{where}.type")
        function = tool.function
        tools.append(
            tool_from(
                name=function.name,
                parameters=function.parameters,
                strict=function.strict,
                definition=tool.model_dump(by_alias=True, exclude_none=True),
                param=f"{where}.function",
            )
        )
    choice = body.tool_choice
    if isinstance(choice, ChatNamedToolChoice):
        if choice.type != "function" or choice.function is None:
            raise Refused(_not_a_function(choice.type, "tool_choice"), "tool_choice.type")
        mode: Mode | None = "named"
        forced: str | None = choice.function.name
    else:
        mode, forced = choice, None
    requested = body.response_format
    schema_format = requested.json_schema if requested is not None else None
    if requested is not None and requested.type == "json_schema" and schema_format is None:
        raise Refused(
            "Missing required parameter: 'response_format.json_schema'.",
            "response_format.json_schema",
        )
    return spec_from(
        tools=tools,
        choice=mode,
        forced=forced,
        parallel=body.parallel_tool_calls,
        format=requested.type if requested is not None else "text",
        schema=schema_format.schema_ if schema_format is not None else None,
        strict=schema_format is not None and schema_format.strict is True,
        format_name=_format_name(schema_format, "response_format.json_schema.name"),
        format_param="response_format",
    )


def responses_spec(body: ResponsesRequest) -> OutputSpec:
    """A Responses request's ``tools``, ``tool_choice``, ``parallel_tool_calls`` and
    ``text.format``, checked."""
    tools = []
    for index, tool in enumerate(body.tools or ()):
        where = f"tools.{index}"
        if tool.type != "function":
            raise Refused(_not_a_function(tool.type, where), f"{where}.type")
        tools.append(
            tool_from(
                name=tool.name,
                parameters=tool.parameters,
                strict=tool.strict,
                definition=tool.model_dump(by_alias=True, exclude_none=True),
                param=where,
            )
        )
    choice = body.tool_choice
    if isinstance(choice, ResponsesNamedToolChoice):
        if choice.type != "function" or choice.name is None:
            raise Refused(_not_a_function(choice.type, "tool_choice"), "tool_choice.type")
        mode: Mode | None = "named"
        forced: str | None = choice.name
    else:
        mode, forced = choice, None
    text_format = body.text.format if body.text is not None else None
    kind = text_format.type if text_format is not None else "text"
    return spec_from(
        tools=tools,
        choice=mode,
        forced=forced,
        parallel=body.parallel_tool_calls,
        format=kind,
        schema=text_format.schema_ if text_format is not None else None,
        strict=text_format is not None and text_format.strict is True,
        format_name=_format_name(
            text_format if kind == "json_schema" else None, "text.format.name"
        ),
        format_param="text.format",
    )


def chat_turns(messages: Sequence[ChatMessage]) -> tuple[str, str]:
    """The role of the last message and the text of the last user message."""
    user = next((m.text() for m in reversed(messages) if m.role == "user"), "")
    return messages[-1].role, user


def responses_turns(body: ResponsesRequest) -> tuple[str, str]:
    """The role of the last input item (a function call's output is the tool's) and
    the text of the last user message."""
    if isinstance(body.input, str):
        return "user", body.input
    last = body.input[-1]
    role = (
        "tool"
        if isinstance(last, FunctionCallOutputItem)
        else "assistant"
        if isinstance(last, FunctionCallItem)
        else last.role
    )
    user = next(
        (
            i.text()
            for i in reversed(body.input)
            if isinstance(i, InputMessage) and i.role == "user"
        ),
        "",
    )
    return role, user


def _format_name(schema_format: JSONSchemaFormat | TextFormat | None, param: str) -> str:
    if schema_format is None:
        return ""
    if not _NAME.fullmatch(schema_format.name):
        raise Refused(
            f"Invalid '{param}': {schema_format.name!r}. The name must be 1 to 64 characters of"
            " a-z, A-Z, 0-9, underscores and dashes.",
            param,
        )
    return schema_format.name


def _not_a_function(kind: str, where: str) -> str:
    return (
        f"Invalid value for '{where}.type': {kind!r}. This server answers function tools"
        " only (type 'function')."
    )
