"""The asynchronous client: ``stormguard.AsyncClient``, its resources and their methods.

Each method builds a ``CallSpec`` (``ClientCore``) and runs it as one logical
call (``_drivers.py``: the call's I/O; ``_call_flow.py``: its every decision).
The sync and async clients are one text: ``_client.py`` is generated from
``_async_client.py`` by scripts/unasync.py (``make unasync``; a test checks it).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, overload

from ._api_specs import embeddings_spec, model_spec, responses_spec
from ._base_client import (
    DEFAULT_CONNECTION_LIMITS,
    NOT_GIVEN,
    BaseClient,
    CallExtras,
    CallTimeout,
    ClientOptions,
    check_http_options,
)
from ._compat import Unpack
from ._drivers import http_pool_async, run_call_async
from ._models import (
    ChatCompletion,
    ChatCompletionChunk,
    Completion,
    CreateEmbeddingResponse,
    Model,
    ModelList,
    Response,
    ResponseStreamEvent,
)
from ._options import Unset
from ._pipeline import CallSpec, HandOver
from ._raw_response import async_to_raw_response_wrapper
from ._stream_timeouts import StreamTimeouts
from ._streamed_response import async_to_streamed_response_wrapper
from ._streaming import AsyncStream

if TYPE_CHECKING:
    from ._http import AsyncHTTPClient, LimitsLike

__all__ = ["AsyncClient"]


class AsyncClient(BaseClient):
    """An OpenAI-compatible client that cannot make an overloaded server worse.

    >>> client = AsyncClient(base_url="http://127.0.0.1:8000/v1", model="sim")  # doctest: +SKIP
    >>> resp = await client.chat.completions.create(messages=[{"role": "user", "content": "hi"}])
    ...                                                                    # doctest: +SKIP
    >>> resp.choices[0].message.content, resp.server_load.queue_depth    # doctest: +SKIP

    ``timeout`` is the total time of one call, every attempt and backoff
    included, and no phase of it outlasts it (docs/retries.md, "What the deadline
    bounds"). ``http_client`` lets you bring your own ``httpx.AsyncClient`` or
    ``httpx2.AsyncClient`` (proxies, TLS, limits); the client then does not close it,
    and the calls made on it keep their deadlines (``_drivers.py`` says how).
    """

    def __init__(
        self,
        *,
        http_client: AsyncHTTPClient | None = None,
        connection_limits: LimitsLike | None = None,
        **options: Unpack[ClientOptions],
    ) -> None:
        """``http_client``: your own ``httpx.AsyncClient`` or ``httpx2.AsyncClient``, which
        ``close()`` then leaves open; ``connection_limits``: the pool limits of the
        client's own (``DEFAULT_CONNECTION_LIMITS``, openai-python's, by default).
        The other options: ``ClientOptions``."""
        limits = check_http_options(http_client, "AsyncClient", connection_limits)
        super().__init__(**options)
        self._owns_http = http_client is None
        self._http = http_pool_async(http_client, limits or DEFAULT_CONNECTION_LIMITS)
        self._bind_resources()

    def _bind_resources(self) -> None:
        self.chat = AsyncChat(self)
        self.completions = AsyncCompletions(self)
        self.embeddings = AsyncEmbeddings(self)
        self.responses = AsyncResponses(self)
        self.models = AsyncModels(self)

    # -- I/O: _drivers.py ----------------------------------------------------------

    async def _request(self, spec: CallSpec, hand_over: HandOver = "") -> Any:
        """Run one logical call; ``hand_over``: what the caller gets besides the result
        (a ``Delivery``, for ``with_raw_response``/``with_streaming_response``)."""
        if hand_over:
            spec = replace(spec, hand_over=hand_over)
        return await run_call_async(self._core, self._http, spec)

    @property
    def with_raw_response(self) -> AsyncClientWithRawResponse:
        """Every resource's ``with_raw_response`` (``client.with_raw_response.chat
        .completions.create(...)``), as openai-python's."""
        return AsyncClientWithRawResponse(self)

    @property
    def with_streaming_response(self) -> AsyncClientWithStreamingResponse:
        """Every resource's ``with_streaming_response``, as openai-python's."""
        return AsyncClientWithStreamingResponse(self)

    async def close(self) -> None:
        """Close the connection pool (unless the httpx client was passed in)."""
        if self._owns_http:
            await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()


class AsyncChatCompletions:
    """``client.chat.completions``."""

    def __init__(self, client: AsyncClient, hand_over: HandOver = "") -> None:
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
        stream_timeouts: StreamTimeouts | Unset | None = NOT_GIVEN,
        extra_headers: Mapping[str, str] | None = None,
        extra_query: Mapping[str, object] | None = None,
        extra_body: Mapping[str, Any] | None = None,
        **params: Any,
    ) -> ChatCompletion | AsyncStream[ChatCompletionChunk]:
        """Create a chat completion; any other keyword (``max_tokens``, ``temperature``,
        vLLM's ``ignore_eos`` ...) goes into the request body as given."""
        spec = self._client._core.chat_spec(
            messages=messages,
            model=model,
            stream=stream,
            extras=CallExtras(timeout, extra_headers, extra_query, extra_body),
            params={**params, "stream_timeouts": stream_timeouts},
        )
        result: ChatCompletion | AsyncStream[ChatCompletionChunk] = await self._client._request(
            spec, self._hand_over
        )
        return result


class AsyncChat:
    """``client.chat``."""

    def __init__(self, client: AsyncClient) -> None:
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

    def __init__(self, client: AsyncClient, hand_over: HandOver = "") -> None:
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
            params={**params, "stream_timeouts": stream_timeouts},
        )
        result: Completion | AsyncStream[Completion] = await self._client._request(
            spec, self._hand_over
        )
        return result


class AsyncModels:
    """``client.models``."""

    def __init__(self, client: AsyncClient, hand_over: HandOver = "") -> None:
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

    def __init__(self, client: AsyncClient, hand_over: HandOver = "") -> None:
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
        )
        result: CreateEmbeddingResponse = await self._client._request(spec, self._hand_over)
        return result


class AsyncResponses:
    """``client.responses`` (the Responses API: ``create``, streamed or not)."""

    def __init__(self, client: AsyncClient, hand_over: HandOver = "") -> None:
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
                "stream_timeouts": stream_timeouts,
                **params,
            },
        )
        result: Response | AsyncStream[ResponseStreamEvent] = await self._client._request(
            spec, self._hand_over
        )
        return result


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


class AsyncClientWithRawResponse:
    """``client.with_raw_response``: each resource's ``with_raw_response``."""

    def __init__(self, client: AsyncClient) -> None:
        self.chat = client.chat.with_raw_response
        self.completions = client.completions.with_raw_response
        self.embeddings = client.embeddings.with_raw_response
        self.models = client.models.with_raw_response
        self.responses = client.responses.with_raw_response


class AsyncChatWithStreamingResponse:
    """``client.chat.with_streaming_response``."""

    def __init__(self, chat: AsyncChat) -> None:
        self.completions = chat.completions.with_streaming_response


class AsyncClientWithStreamingResponse:
    """``client.with_streaming_response``: each resource's ``with_streaming_response``."""

    def __init__(self, client: AsyncClient) -> None:
        self.chat = client.chat.with_streaming_response
        self.completions = client.completions.with_streaming_response
        self.embeddings = client.embeddings.with_streaming_response
        self.models = client.models.with_streaming_response
        self.responses = client.responses.with_streaming_response
