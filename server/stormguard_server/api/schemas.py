"""Request bodies of the OpenAI-compatible API, as pydantic models.

Strict types (a string is not a number) so that bad input is a 400, never a
coercion surprise; unknown fields are accepted and ignored, as the openai
package sends many that a simulator has no use for (temperature, seed, ...).
They also feed the OpenAPI schema that the fuzz tests generate requests from.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag

# Far above any model's context, far below what would overflow anything.
MAX_TOKENS_LIMIT = 1_000_000_000

MaxTokens = Annotated[int, Field(ge=1, le=MAX_TOKENS_LIMIT)]
StopStrings = Annotated[list[Annotated[str, Field(max_length=256)]], Field(max_length=16)]


class _Lenient(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow", populate_by_name=True)


class StreamOptions(_Lenient):
    include_usage: bool = False


class TextPart(_Lenient):
    type: Literal["text"]
    text: str


class CalledFunction(_Lenient):
    name: str
    arguments: str


class MessageToolCall(_Lenient):
    """A tool call of an earlier assistant message, sent back in the conversation."""

    id: str
    type: Literal["function"] = "function"
    function: CalledFunction


class ChatMessage(_Lenient):
    role: Annotated[str, Field(min_length=1, max_length=64)]
    content: str | list[TextPart] | None = None
    tool_calls: list[MessageToolCall] | None = None
    tool_call_id: str | None = None

    def text(self) -> str:
        """The message's text, parts joined, and its tool calls (they are prompt too)."""
        if self.content is None:
            said = ""
        elif isinstance(self.content, str):
            said = self.content
        else:
            said = "".join(part.text for part in self.content)
        calls = "".join(
            f"<|tool_call|>{call.function.name}({call.function.arguments})"
            for call in self.tool_calls or ()
        )
        return said + calls


# -- tools and structured output (tool_requests.py checks them) ------------------------


class FunctionDefinition(_Lenient):
    """A chat tool's function. Its name is checked by ``tool_requests.py``, which can name
    the field in OpenAI's words; ``parameters`` is a JSON Schema (``schema_check.py``)."""

    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ChatTool(_Lenient):
    type: str
    function: FunctionDefinition | None = None


class FunctionName(_Lenient):
    name: str


class ChatNamedToolChoice(_Lenient):
    type: str
    function: FunctionName | None = None


ToolChoiceMode = Literal["none", "auto", "required"]


class JSONSchemaFormat(_Lenient):
    name: Annotated[str, Field(max_length=256)] = "response"
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Lenient):
    """Chat's ``response_format``."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JSONSchemaFormat | None = None


class _ToolParams(_Lenient):
    parallel_tool_calls: bool | None = None


class ChatToolParams(_ToolParams):
    tools: list[ChatTool] | None = None
    tool_choice: ToolChoiceMode | ChatNamedToolChoice | None = None
    response_format: ResponseFormat | None = None


class _GenerationParams(_Lenient):
    model: str | None = None
    max_tokens: MaxTokens | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: Annotated[str, Field(max_length=256)] | StopStrings | None = None
    ignore_eos: bool = False
    n: Annotated[int, Field(ge=1, le=1)] = 1

    def stop_strings(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        if isinstance(self.stop, str):
            return (self.stop,) if self.stop else ()
        return tuple(s for s in self.stop if s)

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class ChatCompletionRequest(_GenerationParams, ChatToolParams):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: MaxTokens | None = None

    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


class CompletionRequest(_GenerationParams):
    prompt: str | Annotated[list[str], Field(min_length=1, max_length=1)]

    def prompt_text(self) -> str:
        return self.prompt if isinstance(self.prompt, str) else self.prompt[0]

    def requested_max_tokens(self) -> int | None:
        return self.max_tokens


class TokenizeRequest(_Lenient):
    """vLLM's /tokenize: a ``prompt`` or chat ``messages``."""

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_generation_prompt: bool = True
    add_special_tokens: bool = True


class EmbeddingRequest(_Lenient):
    """OpenAI's embeddings request. ``input`` is checked further by the route
    (``embeddings.inputs_of``), which can name what is wrong in openai's words."""

    input: str | list[str] | list[int] | list[list[int]]
    model: str | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Annotated[int, Field(ge=1)] | None = None
    user: str | None = None


class InputText(_Lenient):
    """A text part of a Responses API input message (``output_text``: an earlier answer)."""

    type: Literal["input_text", "output_text"]
    text: str


class InputMessage(_Lenient):
    """A Responses API input message (``EasyInputMessage`` or a ``message`` item)."""

    type: Literal["message"] = "message"
    role: Annotated[str, Field(min_length=1, max_length=64)]
    content: str | list[InputText]

    def text(self) -> str:
        """The message's text, parts joined."""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class FunctionCallItem(_Lenient):
    """A function call of an earlier response, sent back in the conversation."""

    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str


class FunctionCallOutputItem(_Lenient):
    """A function call's result: the turn an agent loop sends after calling a tool."""

    type: Literal["function_call_output"]
    call_id: str
    output: str | list[InputText]

    def text(self) -> str:
        if isinstance(self.output, str):
            return self.output
        return "".join(part.text for part in self.output)


def _item_type(item: Any) -> str:
    kind = item.get("type", "message") if isinstance(item, dict) else getattr(item, "type", None)
    return kind if isinstance(kind, str) else "message"


InputItem = Annotated[
    Annotated[InputMessage, Tag("message")]
    | Annotated[FunctionCallItem, Tag("function_call")]
    | Annotated[FunctionCallOutputItem, Tag("function_call_output")],
    Discriminator(_item_type),
]


class ResponsesTool(_Lenient):
    """A Responses API tool: a function is flat (``name``, ``parameters`` beside
    ``type``); other types (web search, files...) are refused by ``tool_requests.py``."""

    type: str
    name: str | None = None
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ResponsesNamedToolChoice(_Lenient):
    type: str
    name: str | None = None


class TextFormat(_Lenient):
    """``text.format``: chat's ``response_format`` with the ``json_schema`` fields flat."""

    type: Literal["text", "json_object", "json_schema"]
    name: Annotated[str, Field(max_length=256)] = "response"
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class TextConfig(_Lenient):
    format: TextFormat | None = None


class ResponsesRequest(_ToolParams):
    """The Responses API's request: ``input`` as a string or a list of messages, function
    calls and their outputs, ``instructions`` as the system message; function tools
    and ``text.format``. Files, images, other tools and ``previous_response_id``
    are not served (an item or part of another type is a 400)."""

    input: str | Annotated[list[InputItem], Field(min_length=1)]
    tools: list[ResponsesTool] | None = None
    tool_choice: ToolChoiceMode | ResponsesNamedToolChoice | None = None
    text: TextConfig | None = None
    instructions: str | None = None
    model: str | None = None
    max_output_tokens: MaxTokens | None = None
    stream: bool = False
    temperature: Annotated[float, Field(ge=0, le=2)] | None = None
    top_p: Annotated[float, Field(ge=0, le=1)] | None = None
    ignore_eos: bool = False

    def messages(self) -> list[tuple[str, str]]:
        """(role, text) of the conversation, instructions first."""
        said: list[tuple[str, str]] = []
        if self.instructions is not None:
            said.append(("system", self.instructions))
        if isinstance(self.input, str):
            said.append(("user", self.input))
            return said
        for item in self.input:
            if isinstance(item, FunctionCallItem):
                said.append(("assistant", f"<|tool_call|>{item.name}({item.arguments})"))
            elif isinstance(item, FunctionCallOutputItem):
                said.append(("tool", item.text()))
            else:
                said.append((item.role, item.text()))
        return said
