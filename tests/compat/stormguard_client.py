"""The ``stormguard_client`` form of the compat examples: stormguard's own ``Client`` and
``AsyncClient`` under openai's names, as ``stormguard.OpenAI`` is where openai-python is
not installed. An example's ``import stormguard as openai`` and ``from stormguard import
OpenAI`` are pointed here (forms.py), so the drop-in claim holds for stormguard's own
client too, with its own records, streams and errors."""

from __future__ import annotations

from stormguard import (
    APIConnectionError,
    APIError,
    APIStatusError,
    NotFoundError,
    RateLimitError,
)
from stormguard import AsyncClient as AsyncOpenAI
from stormguard import Client as OpenAI

__all__ = [
    "APIConnectionError",
    "APIError",
    "APIStatusError",
    "AsyncOpenAI",
    "NotFoundError",
    "OpenAI",
    "RateLimitError",
]
