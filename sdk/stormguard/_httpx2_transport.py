"""The pipeline as an httpx2 transport: openai-python 3.x runs on httpx2 and types
its ``http_client`` as an ``httpx2.Client``, so ``stormguard.httpx_client()`` hands
it one of those, natively, with no legacy path (``_transport.py`` has the logic;
these are httpx2's shells around it). Imported only when an httpx2 client is asked
for: httpx2 is not a dependency of stormguard."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any, cast

import anyio
import httpx2

from ._async_client import AsyncClient
from ._client import Client
from ._http import httpx
from ._streaming import AsyncStream, Stream
from ._transport import ahandle, areplay, handle, replay

__all__ = ["AsyncHttpx2Transport", "Httpx2Transport"]


class _ReplayStream(httpx2.SyncByteStream):
    def __init__(self, stream: Stream[Any], request: httpx.Request) -> None:
        self._stream, self._request = stream, request

    def __iter__(self) -> Iterator[bytes]:
        return replay(self._stream, self._request)

    def close(self) -> None:
        self._stream.close()


class _AsyncReplayStream(httpx2.AsyncByteStream):
    def __init__(self, stream: AsyncStream[Any], request: httpx.Request) -> None:
        self._stream, self._request = stream, request

    def __aiter__(self) -> AsyncIterator[bytes]:
        return areplay(self._stream, self._request)

    async def aclose(self) -> None:
        await self._stream.aclose()


class Httpx2Transport(httpx2.BaseTransport):
    """An httpx2 transport whose every request runs stormguard's call pipeline
    (:class:`stormguard.StormguardTransport`'s twin for httpx2)."""

    def __init__(self, client: Client) -> None:
        self._client = client

    @property
    def client(self) -> Client:
        """The stormguard client behind the transport (``stats()``, budget)."""
        return self._client

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        # httpx2's Request and Response have httpx's API; what the pipeline builds for
        # this request is built by httpx2 (``library_of``).
        sent = cast("httpx.Request", request)
        response = handle(self._client, sent, lambda s: _ReplayStream(s, sent))
        return cast("httpx2.Response", response)

    def close(self) -> None:
        self._client.close()


class AsyncHttpx2Transport(httpx2.AsyncBaseTransport):
    """The async twin of :class:`Httpx2Transport`."""

    def __init__(self, client: AsyncClient) -> None:
        self._client = client

    @property
    def client(self) -> AsyncClient:
        return self._client

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        sent = cast("httpx.Request", request)
        response = await ahandle(self._client, sent, lambda s: _AsyncReplayStream(s, sent))
        return cast("httpx2.Response", response)

    async def aclose(self) -> None:
        with anyio.CancelScope(shield=True):
            await self._client.close()


def httpx2_client(client: Client) -> httpx2.Client:
    """An ``httpx2.Client`` over ``client``'s pipeline (no timeout of its own: the
    pipeline gives every attempt its share of the call's deadline)."""
    return httpx2.Client(transport=Httpx2Transport(client), timeout=None)


def async_httpx2_client(client: AsyncClient) -> httpx2.AsyncClient:
    return httpx2.AsyncClient(transport=AsyncHttpx2Transport(client), timeout=None)
