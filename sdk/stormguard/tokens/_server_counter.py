"""Exact counts from the server's own tokenizer: vLLM's ``POST /tokenize``."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeGuard

from .._core.clock import ClockLike, ClockRef
from .._core.fork import fork_safe_lock
from .._core.http import httpx
from ._counter import Message, TokenCounter, Tool
from ._estimate import EstimatingCounter
from ._flow import MAX_LOOKUP_ENDPOINTS, Flow, abandoned, tokenize_url
from ._lru import LRUCache
from ._request import PromptRequest, count_prompt

__all__ = ["ServerTokenizeCounter", "TokenCount", "parse_tokenize_response"]


@dataclass(frozen=True)
class TokenCount:
    """A prompt count, who made it, and the window the server reported with it."""

    tokens: int
    counter: str
    max_model_len: int | None = None


class ServerTokenizeCounter:
    """Asks the server to tokenize (exact for whatever model and chat template it runs).

    The request is the one vLLM documents: ``{"model", "prompt"}`` or ``{"model",
    "messages", "tools", "add_generation_prompt": true}``; the answer's ``count`` (and
    ``max_model_len``) are cached in a bounded LRU keyed by a sha256 of endpoint and
    payload. The network is only used inside :meth:`count_flow`; when the server is
    unreachable, answers an error, or answers something that is not a tokenize
    result (or not within ``timeout``, which bounds the whole lookup, or with a
    body over the driver's size cap), the ``fallback`` counter answers instead, and
    the endpoint is not asked again for ``retry_after`` seconds (a sick server gets
    no extra load from us; at most ``MAX_LOOKUP_ENDPOINTS`` are remembered so).
    Outside a flow (``count_text``, ``count_messages``) there is no server to ask,
    so the fallback answers.
    """

    name = "server:/tokenize"

    def __init__(
        self,
        fallback: TokenCounter | None = None,
        *,
        cache_size: int = 1024,
        retry_after: float = 60.0,
        timeout: float = 2.0,
        clock: ClockLike | None = None,
    ) -> None:
        self.fallback: TokenCounter = fallback if fallback is not None else EstimatingCounter()
        self.retry_after = retry_after
        self.timeout = timeout
        self._clock = ClockRef(clock)
        self._cache: LRUCache[str, TokenCount] = LRUCache(cache_size)
        self._down_until: dict[str, float] = {}
        self._lock = fork_safe_lock()

    def adopt_clock(self, clock: ClockLike) -> None:
        """Read ``clock`` (a client's) unless this was given one of its own."""
        self._clock.adopt(clock)

    def count_text(self, text: str) -> int:
        return self.fallback.count_text(text)

    def count_messages(self, messages: Sequence[Message], *, tools: Sequence[Tool] = ()) -> int:
        return self.fallback.count_messages(messages, tools=tools)

    def count_flow(
        self, request: PromptRequest, *, model: str, base_url: str | httpx.URL
    ) -> Flow[TokenCount]:
        """Count ``request`` with ``POST /tokenize`` at the root of ``base_url``."""
        payload = _tokenize_payload(model, request)
        if payload is None:  # batches and token ids: nothing the endpoint takes
            return self._fallback_count(request)
        url = tokenize_url(base_url)
        key = _cache_key(url, payload)
        cached = self._cache.get(key)
        if cached is not None:
            return cached
        if not self._available(str(url)):
            return self._fallback_count(request)
        lookup = httpx.Request(
            "POST", url, json=payload, extensions={"timeout": httpx.Timeout(self.timeout).as_dict()}
        )
        response = yield lookup
        parsed = parse_tokenize_response(response)
        if parsed is None:
            if not abandoned(lookup):
                self._mark_down(str(url))
            return self._fallback_count(request)
        count, max_model_len = parsed
        result = TokenCount(count, self.name, max_model_len)
        self._cache.put(key, result)
        return result

    def _fallback_count(self, request: PromptRequest) -> TokenCount:
        return TokenCount(count_prompt(self.fallback, request), self.fallback.name)

    def _available(self, url: str) -> bool:
        with self._lock:
            until = self._down_until.get(url)
            if until is None:
                return True
            if until > self._clock.now():
                return False
            del self._down_until[url]
            return True

    def _mark_down(self, url: str) -> None:
        """Rest ``url`` for ``retry_after``; of at most ``MAX_LOOKUP_ENDPOINTS`` resting
        endpoints, the one marked longest ago is forgotten first."""
        with self._lock:
            self._down_until.pop(url, None)
            self._down_until[url] = self._clock.now() + self.retry_after
            if len(self._down_until) > MAX_LOOKUP_ENDPOINTS:
                del self._down_until[next(iter(self._down_until))]

    def __repr__(self) -> str:
        return f"ServerTokenizeCounter(fallback={self.fallback!r})"


def parse_tokenize_response(response: httpx.Response | None) -> tuple[int, int | None] | None:
    """``(count, max_model_len)`` from a vLLM tokenize answer, or None for anything else."""
    if response is None or response.status_code != 200:
        return None
    try:
        data = response.json()
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    count = data.get("count")
    if not _is_int(count) or count < 0:
        return None
    tokens = data.get("tokens")
    if tokens is not None and (not isinstance(tokens, list) or len(tokens) != count):
        return None
    max_model_len = data.get("max_model_len")
    if not _is_int(max_model_len) or max_model_len <= 0:
        max_model_len = None
    return count, max_model_len


def _tokenize_payload(model: str, request: PromptRequest) -> dict[str, Any] | None:
    if request.kind == "chat":
        payload: dict[str, Any] = {
            "model": model,
            "messages": [dict(m) for m in request.messages],
            "add_generation_prompt": True,
        }
        if request.tools:
            payload["tools"] = [dict(t) for t in request.tools]
        return payload
    if len(request.texts) == 1 and not request.token_id_lengths:
        return {"model": model, "prompt": request.texts[0]}
    return None


def _cache_key(url: httpx.URL, payload: dict[str, Any]) -> str:
    canonical = json.dumps(payload, sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha256(f"{url}\n{canonical}".encode()).hexdigest()


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)
