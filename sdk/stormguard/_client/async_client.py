"""The asynchronous client: ``stormguard.AsyncClient``.

Its resources (``client.chat.completions`` ...) and their
``with_raw_response``/``with_streaming_response`` views are in the
``async_resources`` module beside it, which it imports and which never imports it
(each resource holds its client typed as ``AsyncResourceClient``). Each
method builds a ``CallSpec`` (``ClientCore``) and runs it as one logical call
(``_call/drivers.py``: the call's I/O; ``_call/call_flow.py``: the order of its
steps; ``_call/pipeline.py``: its decisions). The
sync and async clients are one text: ``_client/client.py`` and ``_client/resources.py`` are
generated from their async twins by scripts/unasync.py (``make unasync``; a
test checks it).
"""

from __future__ import annotations

from dataclasses import replace
from types import TracebackType
from typing import TYPE_CHECKING, Any

from .._call.arguments import ClientOptions
from .._call.call_spec import CallSpec, HandOver
from .._call.drivers import closed_error, http_pool_async, run_call_async
from .._call.unclosed import PoolFinalizer
from .._core.compat import Unpack
from .async_resources import (
    AsyncChat,
    AsyncCompletions,
    AsyncEmbeddings,
    AsyncModels,
    AsyncResponses,
)
from .base_client import DEFAULT_CONNECTION_LIMITS, BaseClient, check_http_options

if TYPE_CHECKING:
    from .._call.drivers import HTTPBackend  # async only
    from .._core.http import AsyncHTTPClient, LimitsLike

__all__ = ["AsyncClient", "AsyncClientWithRawResponse", "AsyncClientWithStreamingResponse"]


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
    and the calls made on it keep their deadlines (``_call/drivers.py`` says how).
    """

    def __init__(
        self,
        *,
        http_client: AsyncHTTPClient | None = None,
        connection_limits: LimitsLike | None = None,
        http_backend: HTTPBackend | None = None,  # async only
        **options: Unpack[ClientOptions],
    ) -> None:
        """``http_client``: your own ``httpx.AsyncClient`` or ``httpx2.AsyncClient``, which
        ``close()`` then leaves open; ``connection_limits``: the pool limits of the
        client's own (``DEFAULT_CONNECTION_LIMITS``, openai-python's, by default).
        ``http_backend`` (the async client only): the library of that pool, "httpx" or
        "aiohttp" (``pip install 'stormguard[aiohttp]'``; docs/deploy.md, "The aiohttp
        backend"); by default ``$STORMGUARD_HTTP_BACKEND``, else httpx.
        The other options: ``ClientOptions``."""
        limits = check_http_options(http_client, "AsyncClient", connection_limits)
        super().__init__(**options)
        self._owns_http = http_client is None
        self._http = http_pool_async(
            http_client,
            limits or DEFAULT_CONNECTION_LIMITS,
            http_backend,  # async only
        )
        if self._owns_http:  # left unclosed, the pool closes once nothing uses it
            self._core.pool_finalizer = PoolFinalizer(self._http, repr(self))
        self._bind_resources()

    def _bind_resources(self) -> None:
        self.chat = AsyncChat(self)
        self.completions = AsyncCompletions(self)
        self.embeddings = AsyncEmbeddings(self)
        self.responses = AsyncResponses(self)
        self.models = AsyncModels(self)

    # -- I/O: _call/drivers.py ----------------------------------------------------------

    def _request(self, spec: CallSpec, hand_over: HandOver = "") -> Any:
        """Run one logical call; ``hand_over``: what the caller gets besides the result
        (a ``Delivery``, for ``with_raw_response``/``with_streaming_response``). The
        async client returns the call's coroutine, not one of its own around it: one
        object fewer alive while the call waits."""
        if hand_over:
            spec = replace(spec, hand_over=hand_over)
        if self._closed or self._http.is_closed:
            raise closed_error(self._core)
        return run_call_async(self._core, self._http, spec)

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
        """Close the client: its later calls fail at once with ``ClientClosedError``.
        Its own pool is closed, and the calls still in flight on it end with that
        error at once; an ``http_client`` you passed is left open, as is the pool of
        the client a ``with_options`` copy came from (docs/architecture.md, "The
        client's pool: processes, event loops, close")."""
        self._closed = True
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


class AsyncClientWithRawResponse:
    """``client.with_raw_response``: each resource's ``with_raw_response``."""

    def __init__(self, client: AsyncClient) -> None:
        self.chat = client.chat.with_raw_response
        self.completions = client.completions.with_raw_response
        self.embeddings = client.embeddings.with_raw_response
        self.models = client.models.with_raw_response
        self.responses = client.responses.with_raw_response


class AsyncClientWithStreamingResponse:
    """``client.with_streaming_response``: each resource's ``with_streaming_response``."""

    def __init__(self, client: AsyncClient) -> None:
        self.chat = client.chat.with_streaming_response
        self.completions = client.completions.with_streaming_response
        self.embeddings = client.embeddings.with_streaming_response
        self.models = client.models.with_streaming_response
        self.responses = client.responses.with_streaming_response
