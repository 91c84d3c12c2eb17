"""The pipeline as an httpx2 transport: openai-python 3.x runs on httpx2 and types
its ``http_client`` as an ``httpx2.Client``, so ``stormguard.httpx_client()`` hands
it one of those, natively, with no legacy path. These are the httpx transports of
``_transport/transport.py`` and byte streams of ``_transport/replay.py`` with httpx2's base
classes added (what the caller gets is built by its request's library there).
Imported only when an httpx2 client is asked for: httpx2 is not a dependency of
stormguard."""

from __future__ import annotations

import httpx2

from .._client.async_client import AsyncClient
from .._client.client import Client
from .replay import _AsyncReplayStream, _ReplayStream
from .transport import AsyncStormguardTransport, StormguardTransport

__all__ = ["AsyncHttpx2Transport", "Httpx2Transport"]


class _Httpx2ReplayStream(_ReplayStream, httpx2.SyncByteStream):
    """The replayed stream as httpx2's byte stream."""


class _AsyncHttpx2ReplayStream(_AsyncReplayStream, httpx2.AsyncByteStream):
    """The async replayed stream as httpx2's byte stream."""


# The methods take and give httpx2's Request and Response, which have httpx's API.
class Httpx2Transport(StormguardTransport, httpx2.BaseTransport):  # type: ignore[misc]
    """:class:`stormguard.StormguardTransport` as an httpx2 transport."""

    replay_stream = _Httpx2ReplayStream


class AsyncHttpx2Transport(AsyncStormguardTransport, httpx2.AsyncBaseTransport):  # type: ignore[misc]
    """:class:`stormguard.AsyncStormguardTransport` as an httpx2 transport."""

    replay_stream = _AsyncHttpx2ReplayStream


def httpx2_client(client: Client) -> httpx2.Client:
    """An ``httpx2.Client`` over ``client``'s pipeline (no timeout of its own: the
    pipeline gives every attempt its share of the call's deadline)."""
    return httpx2.Client(transport=Httpx2Transport(client), timeout=None)


def async_httpx2_client(client: AsyncClient) -> httpx2.AsyncClient:
    return httpx2.AsyncClient(transport=AsyncHttpx2Transport(client), timeout=None)
