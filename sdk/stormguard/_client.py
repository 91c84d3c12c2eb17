"""The synchronous client: ``stormguard.Client``, its resources and their methods.

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
from ._drivers import http_pool_sync, run_call_sync
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
from ._raw_response import to_raw_response_wrapper
from ._stream_timeouts import StreamTimeouts
from ._streamed_response import to_streamed_response_wrapper
from ._streaming import Stream

if TYPE_CHECKING:
    from ._http import LimitsLike, SyncHTTPClient

__all__ = ["Client"]


class Client(BaseClient):
    """An OpenAI-compatible client that cannot make an overloaded server worse.

    >>> client = Client(base_url="http://127.0.0.1:8000/v1", model="sim")  # doctest: +SKIP
    >>> resp = client.chat.completions.create(messages=[{"role": "user", "content": "hi"}])
    ...                                                                    # doctest: +SKIP
    >>> resp.choices[0].message.content, resp.server_load.queue_depth    # doctest: +SKIP

    ``timeout`` is the total time of one call, every attempt and backoff
    included, and no phase of it outlasts it (docs/retries.md, "What the deadline
    bounds"). ``http_client`` lets you bring your own ``httpx.Client`` or
    ``httpx2.Client`` (proxies, TLS, limits); the client then does not close it,
    and the calls made on it keep their deadlines (``_drivers.py`` says how).
    """

    def __init__(
        self,
        *,
        http_client: SyncHTTPClient | None = None,
        connection_limits: LimitsLike | None = None,
        **options: Unpack[ClientOptions],
    ) -> None:
        """``http_client``: your own ``httpx.Client`` or ``httpx2.Client``, which
        ``close()`` then leaves open; ``connection_limits``: the pool limits of the
        client's own (``DEFAULT_CONNECTION_LIMITS``, openai-python's, by default).
        The other options: ``ClientOptions``."""
        limits = check_http_options(http_client, "Client", connection_limits)
        super().__init__(**options)
        self._owns_http = http_client is None
        self._http = http_pool_sync(http_client, limits or DEFAULT_CONNECTION_LIMITS)
        self._bind_resources()

    def _bind_resources(self) -> None:
        self.chat = Chat(self)
        self.completions = Completions(self)
        self.embeddings = Embeddings(self)
        self.responses = Responses(self)
        self.models = Models(self)

    # -- I/O: _drivers.py ----------------------------------------------------------

    def _request(self, spec: CallSpec, hand_over: HandOver = "") -> Any:
        """Run one logical call; ``hand_over``: what the caller gets besides the result
        (a ``Delivery``, for ``with_raw_response``/``with_streaming_response``)."""
        if hand_over:
            spec = replace(spec, hand_over=hand_over)
        return run_call_sync(self._core, self._http, spec)

    @property
    def with_raw_response(self) -> ClientWithRawResponse:
        """Every resource's ``with_raw_response`` (``client.with_raw_response.chat
        .completions.create(...)``), as openai-python's."""
        return ClientWithRawResponse(self)

    @property
    def with_streaming_response(self) -> ClientWithStreamingResponse:
        """Every resource's ``with_streaming_response``, as openai-python's."""
        return ClientWithStreamingResponse(self)

    def close(self) -> None:
        """Close the connection pool (unless the httpx client was passed in)."""
        if self._owns_http:
            self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class ChatCompletions:
    """``client.chat.completions``."""

    def __init__(self, client: Client, hand_over: HandOver = "") -> None:
        self._client = client
        self._hand_over = hand_over

    @property
    def with_raw_response(self) -> ChatCompletionsWithRawResponse:
        """The same methods, returning the final response with the result
        (``.parse()``), as openai-python's ``.with_raw_response``."""
        return ChatCompletionsWithRawResponse(ChatCompletions(self._client, "response"))

    @property
    def with_streaming_response(self) -> ChatCompletionsWithStreamingResponse:
        """The same methods as context managers of the final response, its body read
        only when asked, as openai-python's ``.with_streaming_response``."""
        return ChatCompletionsWithStreamingResponse(ChatCompletions(self._client, "unread"))

    @overload
    def create(
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
    def create(
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
    ) -> Stream[ChatCompletionChunk]: ...

    def create(
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
    ) -> ChatCompletion | Stream[ChatCompletionChunk]:
        """Create a chat completion; any other keyword (``max_tokens``, ``temperature``,
        vLLM's ``ignore_eos`` ...) goes into the request body as given."""
        spec = self._client._core.chat_spec(
            messages=messages,
            model=model,
            stream=stream,
            extras=CallExtras(timeout, extra_headers, extra_query, extra_body),
            params={**params, "stream_timeouts": stream_timeouts},
        )
        result: ChatCompletion | Stream[ChatCompletionChunk] = self._client._request(
            spec, self._hand_over
        )
        return result


class Chat:
    """``client.chat``."""

    def __init__(self, client: Client) -> None:
        self.completions = ChatCompletions(client)

    @property
    def with_raw_response(self) -> ChatWithRawResponse:
        """``client.chat.with_raw_response.completions``, as openai-python's."""
        return ChatWithRawResponse(self)

    @property
    def with_streaming_response(self) -> ChatWithStreamingResponse:
        """``client.chat.with_streaming_response.completions``, as openai-python's."""
        return ChatWithStreamingResponse(self)


class Completions:
    """``client.completions`` (the legacy text completion endpoint)."""

    def __init__(self, client: Client, hand_over: HandOver = "") -> None:
        self._client = client
        self._hand_over = hand_over

    @property
    def with_raw_response(self) -> CompletionsWithRawResponse:
        """The same methods, returning the final response with the result
        (``.parse()``), as openai-python's ``.with_raw_response``."""
        return CompletionsWithRawResponse(Completions(self._client, "response"))

    @property
    def with_streaming_response(self) -> CompletionsWithStreamingResponse:
        """The same methods as context managers of the final response, its body read
        only when asked, as openai-python's ``.with_streaming_response``."""
        return CompletionsWithStreamingResponse(Completions(self._client, "unread"))

    @overload
    def create(
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
    def create(
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
    ) -> Stream[Completion]: ...

    def create(
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
    ) -> Completion | Stream[Completion]:
        """Create a text completion."""
        spec = self._client._core.completion_spec(
            prompt=prompt,
            model=model,
            stream=stream,
            extras=CallExtras(timeout, extra_headers, extra_query, extra_body),
            params={**params, "stream_timeouts": stream_timeouts},
        )
        result: Completion | Stream[Completion] = self._client._request(spec, self._hand_over)
        return result


class Models:
    """``client.models``."""

    def __init__(self, client: Client, hand_over: HandOver = "") -> None:
        self._client = client
        self._hand_over = hand_over

    @property
    def with_raw_response(self) -> ModelsWithRawResponse:
        """The same methods, returning the final response with the result
        (``.parse()``), as openai-python's ``.with_raw_response``."""
        return ModelsWithRawResponse(Models(self._client, "response"))

    @property
    def with_streaming_response(self) -> ModelsWithStreamingResponse:
        """The same methods as context managers of the final response, its body read
        only when asked, as openai-python's ``.with_streaming_response``."""
        return ModelsWithStreamingResponse(Models(self._client, "unread"))

    def list(
        self,
        *,
        timeout: CallTimeout = NOT_GIVEN,
        extra_headers: Mapping[str, str] | None = None,
        extra_query: Mapping[str, object] | None = None,
    ) -> ModelList:
        """The models the server serves (with ``max_model_len`` on vLLM)."""
        result: ModelList = self._client._request(
            self._client._core.models_spec(extras=CallExtras(timeout, extra_headers, extra_query)),
            self._hand_over,
        )
        return result

    def retrieve(
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
        result: Model = self._client._request(
            model_spec(self._client._core, model, extras), self._hand_over
        )
        return result


class Embeddings:
    """``client.embeddings``."""

    def __init__(self, client: Client, hand_over: HandOver = "") -> None:
        self._client = client
        self._hand_over = hand_over

    @property
    def with_raw_response(self) -> EmbeddingsWithRawResponse:
        """The same methods, returning the final response with the result
        (``.parse()``), as openai-python's ``.with_raw_response``."""
        return EmbeddingsWithRawResponse(Embeddings(self._client, "response"))

    @property
    def with_streaming_response(self) -> EmbeddingsWithStreamingResponse:
        """The same methods as context managers of the final response, its body read
        only when asked, as openai-python's ``.with_streaming_response``."""
        return EmbeddingsWithStreamingResponse(Embeddings(self._client, "unread"))

    def create(
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
        result: CreateEmbeddingResponse = self._client._request(spec, self._hand_over)
        return result


class Responses:
    """``client.responses`` (the Responses API: ``create``, streamed or not)."""

    def __init__(self, client: Client, hand_over: HandOver = "") -> None:
        self._client = client
        self._hand_over = hand_over

    @property
    def with_raw_response(self) -> ResponsesWithRawResponse:
        """The same methods, returning the final response with the result
        (``.parse()``), as openai-python's ``.with_raw_response``."""
        return ResponsesWithRawResponse(Responses(self._client, "response"))

    @property
    def with_streaming_response(self) -> ResponsesWithStreamingResponse:
        """The same methods as context managers of the final response, its body read
        only when asked, as openai-python's ``.with_streaming_response``."""
        return ResponsesWithStreamingResponse(Responses(self._client, "unread"))

    @overload
    def create(
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
    def create(
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
    ) -> Stream[ResponseStreamEvent]: ...

    def create(
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
    ) -> Response | Stream[ResponseStreamEvent]:
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
        result: Response | Stream[ResponseStreamEvent] = self._client._request(
            spec, self._hand_over
        )
        return result


class ChatCompletionsWithRawResponse:
    """``client.chat.completions.with_raw_response``."""

    def __init__(self, completions: ChatCompletions) -> None:
        self.create = to_raw_response_wrapper(completions.create)


class CompletionsWithRawResponse:
    """``client.completions.with_raw_response``."""

    def __init__(self, completions: Completions) -> None:
        self.create = to_raw_response_wrapper(completions.create)


class ModelsWithRawResponse:
    """``client.models.with_raw_response``."""

    def __init__(self, models: Models) -> None:
        self.list = to_raw_response_wrapper(models.list)
        self.retrieve = to_raw_response_wrapper(models.retrieve)


class EmbeddingsWithRawResponse:
    """``client.embeddings.with_raw_response``."""

    def __init__(self, embeddings: Embeddings) -> None:
        self.create = to_raw_response_wrapper(embeddings.create)


class ResponsesWithRawResponse:
    """``client.responses.with_raw_response``."""

    def __init__(self, responses: Responses) -> None:
        self.create = to_raw_response_wrapper(responses.create)


class ChatCompletionsWithStreamingResponse:
    """``client.chat.completions.with_streaming_response``."""

    def __init__(self, completions: ChatCompletions) -> None:
        self.create = to_streamed_response_wrapper(completions.create)


class CompletionsWithStreamingResponse:
    """``client.completions.with_streaming_response``."""

    def __init__(self, completions: Completions) -> None:
        self.create = to_streamed_response_wrapper(completions.create)


class ModelsWithStreamingResponse:
    """``client.models.with_streaming_response``."""

    def __init__(self, models: Models) -> None:
        self.list = to_streamed_response_wrapper(models.list)
        self.retrieve = to_streamed_response_wrapper(models.retrieve)


class EmbeddingsWithStreamingResponse:
    """``client.embeddings.with_streaming_response``."""

    def __init__(self, embeddings: Embeddings) -> None:
        self.create = to_streamed_response_wrapper(embeddings.create)


class ResponsesWithStreamingResponse:
    """``client.responses.with_streaming_response``."""

    def __init__(self, responses: Responses) -> None:
        self.create = to_streamed_response_wrapper(responses.create)


class ChatWithRawResponse:
    """``client.chat.with_raw_response``."""

    def __init__(self, chat: Chat) -> None:
        self.completions = chat.completions.with_raw_response


class ClientWithRawResponse:
    """``client.with_raw_response``: each resource's ``with_raw_response``."""

    def __init__(self, client: Client) -> None:
        self.chat = client.chat.with_raw_response
        self.completions = client.completions.with_raw_response
        self.embeddings = client.embeddings.with_raw_response
        self.models = client.models.with_raw_response
        self.responses = client.responses.with_raw_response


class ChatWithStreamingResponse:
    """``client.chat.with_streaming_response``."""

    def __init__(self, chat: Chat) -> None:
        self.completions = chat.completions.with_streaming_response


class ClientWithStreamingResponse:
    """``client.with_streaming_response``: each resource's ``with_streaming_response``."""

    def __init__(self, client: Client) -> None:
        self.chat = client.chat.with_streaming_response
        self.completions = client.completions.with_streaming_response
        self.embeddings = client.embeddings.with_streaming_response
        self.models = client.models.with_streaming_response
        self.responses = client.responses.with_streaming_response
