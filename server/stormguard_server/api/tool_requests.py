"""From a request's fields to its ``structured.OutputSpec``, checked: chat's ``tools``,
``tool_choice``, ``parallel_tool_calls`` and ``response_format``, the Responses API's
flat function tools and ``text.format``; and which turn a conversation ends on. Each
check that fails is a ``Refused``: a 400 naming the field, in OpenAI's words."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from stormguard_server.api.schema_check import SchemaRefused, check_schema
from stormguard_server.api.schemas import (
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
from stormguard_server.api.structured import (
    MAX_TOOLS,
    NAME,
    NO_PARAMETERS,
    Format,
    Mode,
    OutputSpec,
    Refused,
    Tool,
)


def tool_from(
    *, name: Any, parameters: Any, strict: Any, definition: dict[str, Any], param: str
) -> Tool:
    """One function tool, checked; ``param`` is where it sits (``tools.0.function``)."""
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise Refused(
            f"Invalid '{param}.name': {name!r}. A function name must be 1 to 64 characters of"
            " a-z, A-Z, 0-9, underscores and dashes.",
            f"{param}.name",
        )
    if parameters is None:
        checked = NO_PARAMETERS
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
    """The role of the last message (a legacy ``function`` result is a tool's) and the
    text of the last user message."""
    user = next((m.text() for m in reversed(messages) if m.role == "user"), "")
    last = messages[-1].role
    return ("tool" if last == "function" else last), user


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
    if not NAME.fullmatch(schema_format.name):
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
