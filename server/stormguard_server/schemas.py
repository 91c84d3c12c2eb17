"""Request bodies of the OpenAI-compatible API, as pydantic models.

Strict types (a string is not a number) so that bad input is a 400, never a
coercion surprise; unknown fields are accepted and ignored, as the openai
package sends many that a simulator has no use for (temperature, seed, ...).
They also feed the OpenAPI schema that the fuzz tests generate requests from.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

# Far above any model's context, far below what would overflow anything.
MAX_TOKENS_LIMIT = 1_000_000_000

MaxTokens = Annotated[int, Field(ge=1, le=MAX_TOKENS_LIMIT)]
StopStrings = Annotated[list[Annotated[str, Field(max_length=256)]], Field(max_length=16)]


class _Lenient(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")


class StreamOptions(_Lenient):
    include_usage: bool = False


class TextPart(_Lenient):
    type: Literal["text"]
    text: str


class ChatMessage(_Lenient):
    role: Annotated[str, Field(min_length=1, max_length=64)]
    content: str | list[TextPart] | None = None

    def text(self) -> str:
        """The message's text, parts joined."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


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


class ChatCompletionRequest(_GenerationParams):
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


class ResponsesRequest(_Lenient):
    """The Responses API's request, text in and text out: ``input`` as a string or a list
    of messages, ``instructions`` as the system message. Tools, files, images and
    ``previous_response_id`` are not served (a message part of another type is a 400)."""

    input: str | Annotated[list[InputMessage], Field(min_length=1)]
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
        else:
            said.extend((message.role, message.text()) for message in self.input)
        return said
