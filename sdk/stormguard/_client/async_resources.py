"""The asynchronous client's resources: ``client.chat.completions``,
``client.completions``, ``client.models``, ``client.embeddings`` and
``client.responses``, with openai-python's signatures, and their
``with_raw_response`` and ``with_streaming_response`` views. Each method builds
the call's ``CallSpec`` and hands it to its client (``_request``).

A resource holds its client typed by ``AsyncResourceClient``, what it needs of
it, not by ``AsyncClient``: the client creates its resources and this module
never imports it. Each view sits beside its resource, as in openai-python's
resource modules: the resource creates its views and the views wrap its methods.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Literal, Protocol, overload

from .._call.arguments import CallExtras, CallTimeout
from .._call.call_spec import CallSpec, HandOver
from .._call.client_core import ClientCore
from .._call.openai_conventions import NOT_GIVEN, Unset
from .._call.stream_timeouts import StreamTimeouts
from .._call.streaming import AsyncStream
from .._core.results import (
    ChatCompletion,
    ChatCompletionChunk,
    Completion,
    CreateEmbeddingResponse,
    Model,
    ModelList,
    Response,
    ResponseStreamEvent,
)
from .._policies.hedge.policy import HedgePolicy
from .._policies.routing.deployment import Pin
from .api_specs import embeddings_spec, model_spec, responses_spec
from .raw_response import async_to_raw_response_wrapper
from .streamed_response import async_to_streamed_response_wrapper

__all__ = [
    "AsyncChat",
    "AsyncChatCompletions",
    "AsyncCompletions",
    "AsyncEmbeddings",
    "AsyncModels",
    "AsyncResourceClient",
    "AsyncResponses",
]


class AsyncResourceClient(Protocol):
    """What a resource needs of its client (``AsyncClient`` is one): the state its
    calls share, to build a call's ``CallSpec``, and ``_request``, to run it."""

    @property
    def _core(self) -> ClientCore: ...

    async def _request(self, spec: CallSpec, hand_over: HandOver = "") -> Any: ...


class AsyncChatCompletions:
    """``client.chat.completions``."""

    def __init__(self, client: AsyncResourceClient, hand_over: HandOver = "") -> None:
        self._client = client
        self._hand_over = hand_over

    @property
    def with_raw_response(self) -> AsyncChatCompletionsWithRawResponse:
        """The same methods, returning the final response with the result
        (``.parse()``), as openai-python's ``.with_raw_response``."""
        return AsyncChatCompletionsWithRawResponse(AsyncChatCompletions(self._client, "response"))

    @property
    def with_streaming_response(self) -> AsyncChatCompletionsWithStreamingResponse:
        """The same methods as context managers of the final response, its body read
        only when asked, as openai-python's ``.with_streaming_response``."""
        return AsyncChatCompletionsWithStreamingResponse(
            AsyncChatCompletions(self._client, "unread")
        )

    @overload
    async def create(
        self,
        *,
        messages: Iterable[Mapping[str, Any]],
        model: str | None = ...,
        stream: Literal[False] | None = ...,
        timeout: CallTimeout = ...,
        pin: Pin | None = ...,
        hedge: HedgePolicy | Unset | None = ...,
        extra_headers: Mapping[str, str] | None = ...,
        extra_query: Mapping[str, object] | None = ...,
        extra_body: Mapping[str, Any] | None = ...,
        **params: Any,
    ) -> ChatCompletion: ...

    @overload
    async def create(
        self,
        *,
        messages: Iterable[Mapping[str, Any]],
        model: str | None = ...,
        stream: Literal[True],
        timeout: CallTimeout = ...,
        pin: Pin | None = ...,
        hedge: HedgePolicy | Unset | None = ...,
        stream_timeouts: StreamTimeouts | Unset | None = ...,
        extra_headers: Mapping[str, str] | None = ...,
        extra_query: Mapping[str, object] | None = ...,
        extra_body: Mapping[str, Any] | None = ...,
        **params: Any,
    ) -> AsyncStream[ChatCompletionChunk]: ...

    async def create(
        self,
        *,
        messages: Iterable[Mapping[str, Any]],
        model: str | None = None,
        stream: bool | None = False,
        timeout: CallTimeout = NOT_GIVEN,
        pin: Pin | None = None,
        hedge: HedgePolicy | Unset | None = NOT_GIVEN,
        stream_timeouts: StreamTimeouts | Unset | None = NOT_GIVEN,
        extra_headers: Mapping[str, str] | None = None,
        extra_query: Mapping[str, object] | None = None,
        extra_body: Mapping[str, Any] | None = None,
        **params: Any,
    ) -> ChatCompletion | AsyncStream[ChatCompletionChunk]:
        """Create a chat completion; any other keyword (``max_tokens``, ``temperature``,
        vLLM's ``ignore_eos`` ...) goes into the request body as given. ``pin`` holds
        the call to one tier or deployment (``stormguard.Pin``, docs/providers.md);
        ``hedge`` its hedging (a ``HedgePolicy``, or None: none; the client's by
        default; docs/resilience.md, "Hedged requests")."""
        spec = self._client._core.chat_spec(
            messages=messages,
            model=model,
            stream=stream,
            extras=CallExtras(timeout, extra_headers, extra_query, extra_body),
            params=params,
            pin=pin,
            hedge=hedge,
            stream_timeouts=stream_timeouts,
        )
        result: ChatCompletion | AsyncStream[ChatCompletionChunk] = await self._client._request(
            spec, self._hand_over
        )
        return result


class AsyncChat:
    """``client.chat``."""

    def __init__(self, client: AsyncResourceClient) -> None:
        self.completions = AsyncChatCompletions(client)

    @property
    def with_raw_response(self) -> AsyncChatWithRawResponse:
        """``client.chat.with_raw_response.completions``, as openai-python's."""
        return AsyncChatWithRawResponse(self)

    @property
    def with_streaming_response(self) -> AsyncChatWithStreamingResponse:
        """``client.chat.with_streaming_response.completions``, as openai-python's."""
        return AsyncChatWithStreamingResponse(self)


class AsyncCompletions:
    """``client.completions`` (the legacy text completion endpoint)."""

    def __init__(self, client: AsyncResourceClient, hand_over: HandOver = "") -> None:
        self._client = client
        self._hand_over = hand_over

    @property
    def with_raw_response(self) -> AsyncCompletionsWithRawResponse:
        """The same methods, returning the final response with the result
        (``.parse()``), as openai-python's ``.with_raw_response``."""
        return AsyncCompletionsWithRawResponse(AsyncCompletions(self._client, "response"))

    @property
    def with_streaming_response(self) -> AsyncCompletionsWithStreamingResponse:
        """The same methods as context managers of the final response, its body read
        only when asked, as openai-python's ``.with_streaming_response``."""
        return AsyncCompletionsWithStreamingResponse(AsyncCompletions(self._client, "unread"))

    @overload
    async def create(
        self,
        *,
        prompt: str | list[str] | list[int],
        model: str | None = ...,
        stream: Literal[False] | None = ...,
        timeout: CallTimeout = ...,
        pin: Pin | None = ...,
        hedge: HedgePolicy | Unset | None = ...,
        extra_headers: Mapping[str, str] | None = ...,
        extra_query: Mapping[str, object] | None = ...,
        extra_body: Mapping[str, Any] | None = ...,
        **params: Any,
    ) -> Completion: ...

    @overload
    async def create(
        self,
        *,
        prompt: str | list[str] | list[int],
        model: str | None = ...,
        stream: Literal[True],
        timeout: CallTimeout = ...,
        pin: Pin | None = ...,
        hedge: HedgePolicy | Unset | None = ...,
        stream_timeouts: StreamTimeouts | Unset | None = ...,
        extra_headers: Mapping[str, str] | None = ...,
        extra_query: Mapping[str, object] | None = ...,
        extra_body: Mapping[str, Any] | None = ...,
        **params: Any,
    ) -> AsyncStream[Completion]: ...

    async def create(
        self,
        *,
        prompt: str | list[str] | list[int],
        model: str | None = None,
        stream: bool | None = False,
        timeout: CallTimeout = NOT_GIVEN,
        pin: Pin | None = None,
        hedge: HedgePolicy | Unset | None = NOT_GIVEN,
        stream_timeouts: StreamTimeouts | Unset | None = NOT_GIVEN,
        extra_headers: Mapping[str, str] | None = None,
        extra_query: Mapping[str, object] | None = None,
        extra_body: Mapping[str, Any] | None = None,
        **params: Any,
    ) -> Completion | AsyncStream[Completion]:
        """Create a text completion."""
        spec = self._client._core.completion_spec(
            prompt=prompt,
            model=model,
            stream=stream,
            extras=CallExtras(timeout, extra_headers, extra_query, extra_body),
            params=params,
            pin=pin,
            hedge=hedge,
            stream_timeouts=stream_timeouts,
        )
        result: Completion | AsyncStream[Completion] = await self._client._request(
            spec, self._hand_over
        )
        return result


class AsyncModels:
    """``client.models``."""

    def __init__(self, client: AsyncResourceClient, hand_over: HandOver = "") -> None:
        self._client = client
        self._hand_over = hand_over

    @property
    def with_raw_response(self) -> AsyncModelsWithRawResponse:
        """The same methods, returning the final response with the result
        (``.parse()``), as openai-python's ``.with_raw_response``."""
        return AsyncModelsWithRawResponse(AsyncModels(self._client, "response"))

    @property
    def with_streaming_response(self) -> AsyncModelsWithStreamingResponse:
        """The same methods as context managers of the final response, its body read
        only when asked, as openai-python's ``.with_streaming_response``."""
        return AsyncModelsWithStreamingResponse(AsyncModels(self._client, "unread"))

    async def list(
        self,
        *,
        timeout: CallTimeout = NOT_GIVEN,
        extra_headers: Mapping[str, str] | None = None,
        extra_query: Mapping[str, object] | None = None,
    ) -> ModelList:
        """The models the server serves (with ``max_model_len`` on vLLM)."""
        result: ModelList = await self._client._request(
            self._client._core.models_spec(extras=CallExtras(timeout, extra_headers, extra_query)),
            self._hand_over,
        )
        return result

    async def retrieve(
        self,
        model: str,
        *,
        timeout: CallTimeout = NOT_GIVEN,
        extra_headers: Mapping[str, str] | None = None,
        extra_query: Mapping[str, object] | None = None,
        extra_body: Mapping[str, Any] | None = None,
    ) -> Model:
        """One served model (``GET /models/{model}``; a slash in the id is sent as %2F)."""
        extras = CallExtras(timeout, extra_headers, extra_query, extra_body)
        result: Model = await self._client._request(
            model_spec(self._client._core, model, extras), self._hand_over
        )
        return result


class AsyncEmbeddings:
    """``client.embeddings``."""

    def __init__(self, client: AsyncResourceClient, hand_over: HandOver = "") -> None:
        self._client = client
        self._hand_over = hand_over

    @property
    def with_raw_response(self) -> AsyncEmbeddingsWithRawResponse:
        """The same methods, returning the final response with the result
        (``.parse()``), as openai-python's ``.with_raw_response``."""
        return AsyncEmbeddingsWithRawResponse(AsyncEmbeddings(self._client, "response"))

    @property
    def with_streaming_response(self) -> AsyncEmbeddingsWithStreamingResponse:
        """The same methods as context managers of the final response, its body read
        only when asked, as openai-python's ``.with_streaming_response``."""
        return AsyncEmbeddingsWithStreamingResponse(AsyncEmbeddings(self._client, "unread"))

    async def create(
        self,
        *,
        input: str | list[str] | Iterable[int] | Iterable[Iterable[int]],
        model: str | None = None,
        encoding_format: Literal["float", "base64"] | Unset = NOT_GIVEN,
        timeout: CallTimeout = NOT_GIVEN,
        pin: Pin | None = None,
        extra_headers: Mapping[str, str] | None = None,
        extra_query: Mapping[str, object] | None = None,
        extra_body: Mapping[str, Any] | None = None,
        **params: Any,
    ) -> CreateEmbeddingResponse:
        """Embed ``input`` (a text, texts, token ids or lists of them); ``dimensions``,
        ``user`` and any other keyword go into the body. Without ``encoding_format``
        the vectors travel as base64 and come back as floats, as with openai-python."""
        spec = embeddings_spec(
            self._client._core,
            input=input,
            model=model,
            encoding_format=encoding_format,
            extras=CallExtras(timeout, extra_headers, extra_query, extra_body),
            params=params,
            pin=pin,
        )
        result: CreateEmbeddingResponse = await self._client._request(spec, self._hand_over)
        return result


class AsyncResponses:
    """``client.responses`` (the Responses API: ``create``, streamed or not)."""

    def __init__(self, client: AsyncResourceClient, hand_over: HandOver = "") -> None:
        self._client = client
        self._hand_over = hand_over

    @property
    def with_raw_response(self) -> AsyncResponsesWithRawResponse:
        """The same methods, returning the final response with the result
        (``.parse()``), as openai-python's ``.with_raw_response``."""
        return AsyncResponsesWithRawResponse(AsyncResponses(self._client, "response"))

    @property
    def with_streaming_response(self) -> AsyncResponsesWithStreamingResponse:
        """The same methods as context managers of the final response, its body read
        only when asked, as openai-python's ``.with_streaming_response``."""
        return AsyncResponsesWithStreamingResponse(AsyncResponses(self._client, "unread"))

    @overload
    async def create(
        self,
        *,
        input: str | Iterable[Mapping[str, Any]],
        model: str | None = ...,
        instructions: str | Unset | None = ...,
        max_output_tokens: int | Unset | None = ...,
        stream: Literal[False] | Unset | None = ...,
        timeout: CallTimeout = ...,
        pin: Pin | None = ...,
        extra_headers: Mapping[str, str] | None = ...,
        extra_query: Mapping[str, object] | None = ...,
        extra_body: Mapping[str, Any] | None = ...,
        **params: Any,
    ) -> Response: ...

    @overload
    async def create(
        self,
        *,
        input: str | Iterable[Mapping[str, Any]],
        model: str | None = ...,
        instructions: str | Unset | None = ...,
        max_output_tokens: int | Unset | None = ...,
        stream: Literal[True],
        timeout: CallTimeout = ...,
        pin: Pin | None = ...,
        stream_timeouts: StreamTimeouts | Unset | None = ...,
        extra_headers: Mapping[str, str] | None = ...,
        extra_query: Mapping[str, object] | None = ...,
        extra_body: Mapping[str, Any] | None = ...,
        **params: Any,
    ) -> AsyncStream[ResponseStreamEvent]: ...

    async def create(
        self,
        *,
        input: str | Iterable[Mapping[str, Any]],
        model: str | None = None,
        instructions: str | Unset | None = NOT_GIVEN,
        max_output_tokens: int | Unset | None = NOT_GIVEN,
        stream: bool | Unset | None = False,
        timeout: CallTimeout = NOT_GIVEN,
        pin: Pin | None = None,
        stream_timeouts: StreamTimeouts | Unset | None = NOT_GIVEN,
        extra_headers: Mapping[str, str] | None = None,
        extra_query: Mapping[str, object] | None = None,
        extra_body: Mapping[str, Any] | None = None,
        **params: Any,
    ) -> Response | AsyncStream[ResponseStreamEvent]:
        """Create a model response; with ``stream=True`` a stream of its events
        (``response.created``, ``response.output_text.delta`` ...,
        ``response.completed``). ``temperature``, ``tools`` and any other keyword go
        into the body as given."""
        spec = responses_spec(
            self._client._core,
            input=input,
            model=model,
            stream=stream,
            extras=CallExtras(timeout, extra_headers, extra_query, extra_body),
            params={
                "instructions": instructions,
                "max_output_tokens": max_output_tokens,
                **params,
            },
            pin=pin,
            stream_timeouts=stream_timeouts,
        )
        result: Response | AsyncStream[ResponseStreamEvent] = await self._client._request(
            spec, self._hand_over
        )
        return result


# -- views: openai-python's with_raw_response and with_streaming_response ------------


class AsyncChatCompletionsWithRawResponse:
    """``client.chat.completions.with_raw_response``."""

    def __init__(self, completions: AsyncChatCompletions) -> None:
        self.create = async_to_raw_response_wrapper(completions.create)


class AsyncCompletionsWithRawResponse:
    """``client.completions.with_raw_response``."""

    def __init__(self, completions: AsyncCompletions) -> None:
        self.create = async_to_raw_response_wrapper(completions.create)


class AsyncModelsWithRawResponse:
    """``client.models.with_raw_response``."""

    def __init__(self, models: AsyncModels) -> None:
        self.list = async_to_raw_response_wrapper(models.list)
        self.retrieve = async_to_raw_response_wrapper(models.retrieve)


class AsyncEmbeddingsWithRawResponse:
    """``client.embeddings.with_raw_response``."""

    def __init__(self, embeddings: AsyncEmbeddings) -> None:
        self.create = async_to_raw_response_wrapper(embeddings.create)


class AsyncResponsesWithRawResponse:
    """``client.responses.with_raw_response``."""

    def __init__(self, responses: AsyncResponses) -> None:
        self.create = async_to_raw_response_wrapper(responses.create)


class AsyncChatCompletionsWithStreamingResponse:
    """``client.chat.completions.with_streaming_response``."""

    def __init__(self, completions: AsyncChatCompletions) -> None:
        self.create = async_to_streamed_response_wrapper(completions.create)


class AsyncCompletionsWithStreamingResponse:
    """``client.completions.with_streaming_response``."""

    def __init__(self, completions: AsyncCompletions) -> None:
        self.create = async_to_streamed_response_wrapper(completions.create)


class AsyncModelsWithStreamingResponse:
    """``client.models.with_streaming_response``."""

    def __init__(self, models: AsyncModels) -> None:
        self.list = async_to_streamed_response_wrapper(models.list)
        self.retrieve = async_to_streamed_response_wrapper(models.retrieve)


class AsyncEmbeddingsWithStreamingResponse:
    """``client.embeddings.with_streaming_response``."""

    def __init__(self, embeddings: AsyncEmbeddings) -> None:
        self.create = async_to_streamed_response_wrapper(embeddings.create)


class AsyncResponsesWithStreamingResponse:
    """``client.responses.with_streaming_response``."""

    def __init__(self, responses: AsyncResponses) -> None:
        self.create = async_to_streamed_response_wrapper(responses.create)


class AsyncChatWithRawResponse:
    """``client.chat.with_raw_response``."""

    def __init__(self, chat: AsyncChat) -> None:
        self.completions = chat.completions.with_raw_response


class AsyncChatWithStreamingResponse:
    """``client.chat.with_streaming_response``."""

    def __init__(self, chat: AsyncChat) -> None:
        self.completions = chat.completions.with_streaming_response
