"""What test_typing.py holds mypy --strict to: openai-python 3.x's clients take
stormguard's HTTP clients as they are typed, with no ignore and no cast, and
``library="httpx"`` asks for httpx's (openai 1.x and 2.x)."""

from __future__ import annotations

import httpx
import httpx2
import openai

import stormguard

BASE_URL = "http://127.0.0.1:8000/v1"


def sync_client() -> openai.OpenAI:
    return openai.OpenAI(
        base_url=BASE_URL,
        http_client=stormguard.httpx_client(base_url=BASE_URL, timeout=30),
        max_retries=0,
    )


def async_client() -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        base_url=BASE_URL,
        http_client=stormguard.async_httpx_client(base_url=BASE_URL),
        max_retries=0,
    )


def by_name() -> tuple[httpx2.Client, httpx.Client, httpx.AsyncClient]:
    return (
        stormguard.httpx_client(library="httpx2", base_url=BASE_URL),
        stormguard.httpx_client(library="httpx", base_url=BASE_URL),
        stormguard.async_httpx_client(library="httpx", base_url=BASE_URL),
    )
