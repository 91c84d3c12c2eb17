"""The async client's HTTP library is the one ``$STORMGUARD_HTTP_BACKEND`` names.

``make test-aiohttp`` runs the end-to-end suite (hostile servers, drips and bombs,
abandoned and cancelled calls, deadlines, streams, failover) a second time with
``STORMGUARD_HTTP_BACKEND=aiohttp``: every ``AsyncClient`` built without
``http_backend`` then runs on aiohttp. This test fails if that run were silently on
httpx (or the default one on aiohttp), so the second run proves what it says.
"""

from __future__ import annotations

import os

import stormguard
from stormguard._call.drivers import BACKEND_VARIABLE


async def test_the_async_client_runs_on_the_backend_the_environment_names() -> None:
    named = os.environ.get(BACKEND_VARIABLE) or "httpx"
    async with stormguard.AsyncClient(base_url="http://127.0.0.1:9/v1", api_key="sk-x") as client:
        # The pool's transport for this event loop (``_io/pool_life.LoopTransport``).
        transport = type(client._http._transport.transport)  # type: ignore[attr-defined]
    on_aiohttp = transport.__name__ == "AiohttpTransport"
    assert on_aiohttp == (named == "aiohttp"), transport
