"""I/O-free flows and their two drivers: the only place where sync and async differ.

A flow is a generator in the style of httpx's ``Auth.auth_flow``: it yields the
``httpx.Request`` it needs, is sent back the ``httpx.Response`` (or None when the
request failed: refused, timed out, reset), and finally returns its result. The
logic is written once; :func:`run_precheck_sync` and :func:`run_precheck_async`
only do the I/O.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import TypeVar

import httpx

__all__ = ["Flow", "models_url", "run_precheck_async", "run_precheck_sync", "tokenize_url"]

T = TypeVar("T")

Flow = Generator[httpx.Request, "httpx.Response | None", T]


def run_precheck_sync(flow: Flow[T], client: httpx.Client) -> T:
    """Drive ``flow`` with a sync client; transport errors are sent in as None."""
    try:
        request = next(flow)
        while True:
            response: httpx.Response | None
            try:
                response = client.send(_with_client_headers(request, client.headers))
            except httpx.HTTPError:
                response = None
            request = flow.send(response)
    except StopIteration as stop:
        result: T = stop.value
        return result


async def run_precheck_async(flow: Flow[T], client: httpx.AsyncClient) -> T:
    """Drive ``flow`` with an async client; transport errors are sent in as None."""
    try:
        request = next(flow)
        while True:
            response: httpx.Response | None
            try:
                response = await client.send(_with_client_headers(request, client.headers))
            except httpx.HTTPError:
                response = None
            request = flow.send(response)
    except StopIteration as stop:
        result: T = stop.value
        return result


def _with_client_headers(request: httpx.Request, defaults: httpx.Headers) -> httpx.Request:
    # client.send() applies the client's auth but not its default headers (an
    # api-key header, for instance), so the drivers add those the flow did not set.
    for key, value in defaults.multi_items():
        if key not in request.headers:
            request.headers[key] = value
    return request


def models_url(base_url: str | httpx.URL) -> httpx.URL:
    """``{base}/models``: the OpenAI-compatible model list under the API base."""
    url = httpx.URL(str(base_url))
    return url.copy_with(path=url.path.rstrip("/") + "/models", query=None)


def tokenize_url(base_url: str | httpx.URL) -> httpx.URL:
    """``/tokenize`` at the server root: vLLM mounts it beside ``/v1``, not under it."""
    url = httpx.URL(str(base_url))
    path = url.path.rstrip("/")
    path = path.removesuffix("/v1")
    return url.copy_with(path=path + "/tokenize", query=None)
