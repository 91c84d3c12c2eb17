"""The transport form of the compat examples: openai-python's own client over stormguard.

Each example imports from stormguard; its transport form imports from this module
instead (``import stormguard as openai`` becomes ``import
tests.compat.openai_over_stormguard as openai``), which is what a project writes once to
put stormguard under openai-python: ``OpenAI`` and ``AsyncOpenAI`` are openai's classes
with ``http_client=stormguard.httpx_client(...)`` (``async_httpx_client`` for
``AsyncOpenAI``) unless the caller gives one, and nothing else: openai's ``max_retries``
stays at its default, since openai's retries never stack on stormguard's (the
transport's final answers say so). The base URL comes from the arguments or
``OPENAI_BASE_URL``, as openai reads it. The errors are openai's own, since under the
transport openai raises them.

openai 3.x runs on httpx2 and types ``http_client`` as an ``httpx2.Client``:
``stormguard.httpx_client`` returns one (the library the installed openai runs on), and
mypy --strict accepts it (typed_http_client.py). The keywords pass through untyped here
(``**kwargs: Any``) only because openai's own signatures take them.
"""

from __future__ import annotations

import os
from typing import Any

import openai
from openai import APIConnectionError, APIError, APIStatusError, NotFoundError, RateLimitError

import stormguard

__all__ = [
    "APIConnectionError",
    "APIError",
    "APIStatusError",
    "AsyncOpenAI",
    "NotFoundError",
    "OpenAI",
    "RateLimitError",
]


def _base_url(kwargs: dict[str, Any]) -> str:
    url = kwargs.get("base_url") or os.environ.get("OPENAI_BASE_URL")
    if not url:
        raise ValueError("give base_url or set OPENAI_BASE_URL")
    return str(url)


class OpenAI(openai.OpenAI):
    """``openai.OpenAI`` over ``stormguard.httpx_client``."""

    def __init__(self, **kwargs: Any) -> None:
        if "http_client" not in kwargs:
            kwargs["http_client"] = stormguard.httpx_client(base_url=_base_url(kwargs))
        super().__init__(**kwargs)


class AsyncOpenAI(openai.AsyncOpenAI):
    """``openai.AsyncOpenAI`` over ``stormguard.async_httpx_client``."""

    def __init__(self, **kwargs: Any) -> None:
        if "http_client" not in kwargs:
            kwargs["http_client"] = stormguard.async_httpx_client(base_url=_base_url(kwargs))
        super().__init__(**kwargs)
