"""TokenPolicy: the pre-check that refuses a request before it costs a round trip."""

from __future__ import annotations

import logging
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._core.clock import ClockLike
from .._core.exceptions import ContextWindowExceededError
from .._core.fork import fork_safe_lock
from .._core.http import httpx
from .._core.precheck import Precheck
from ._counter import TokenCounter
from ._estimate import EstimatingCounter
from ._flow import Flow
from ._match import ModelMap
from ._rate_limit import Reservation, TokenRateLimiter
from ._request import Kind, PromptRequest, count_prompt, read_request
from ._server_context_windows import ServerContextWindows
from ._server_counter import ServerTokenizeCounter, TokenCount

if TYPE_CHECKING:
    from tiktoken import Encoding

__all__ = ["DEFAULT_MAX_TOKENS", "TokenPolicy"]

logger = logging.getLogger("stormguard.tokens")

#: Completion length assumed when a request sets no ``max_tokens``. Servers differ
#: (vLLM fills the rest of the context window, OpenAI caps per model), so the check assumes
#: a typical answer; set ``max_tokens`` for an exact check and rate-limit cost.
DEFAULT_MAX_TOKENS = 1024


class TokenPolicy:
    """Counters, context windows and the token rate limit, per model.

    Counter choice for a model: ``counters`` (exact name or glob, see
    :class:`ModelMap`) → tiktoken when the model is an OpenAI one and its BPE file
    is installed → the server's ``/tokenize`` (with an estimate as its fallback)
    when the call has a base URL → :class:`EstimatingCounter`.

    Window choice: ``context_windows`` → the server's ``max_model_len`` (from
    ``/tokenize`` or ``/v1/models``, cached per endpoint) → the built-in table of
    OpenAI models → unknown (not checked).

        policy = TokenPolicy(
            counters={"meta-llama/*": HuggingFaceCounter("llama3/tokenizer.json")},
            context_windows={"my-finetune": 32_768},
            context_fallbacks={"gpt-4": "gpt-4-turbo"},
            rate_limiter=TokenRateLimiter(tokens_per_minute=200_000),
        )
        check = run_precheck_sync(
            policy.precheck_flow("gpt-4o", "chat", body, base_url=base_url), client
        )

    Each lookup ends within ``lookup_timeout`` (the whole exchange) and within the
    call's deadline; one that does not is a failed lookup, as is one whose body is
    over the client's ``max_response_bytes``. Prompts are never truncated: a request
    that cannot fit is refused.
    """

    def __init__(
        self,
        *,
        counters: Mapping[str, TokenCounter] | None = None,
        context_windows: Mapping[str, int] | None = None,
        default_max_tokens: int | Mapping[str, int] = DEFAULT_MAX_TOKENS,
        context_fallbacks: Mapping[str, str] | None = None,
        rate_limiter: TokenRateLimiter | None = None,
        server_context_windows: bool = True,
        server_tokenize: bool = True,
        server_cache_ttl: float = 600.0,
        server_retry_after: float = 60.0,
        lookup_timeout: float = 2.0,
        bpe_directories: Sequence[str | Path] = (),
        clock: ClockLike | None = None,
        server_windows: bool | None = None,
    ) -> None:
        if server_windows is not None:
            warnings.warn(
                "TokenPolicy(server_windows=...) is deprecated; use server_context_windows=...",
                DeprecationWarning,
                stacklevel=2,
            )
            server_context_windows = server_windows
        self.counters = ModelMap(counters)
        self.context_windows = ModelMap(context_windows)
        if isinstance(default_max_tokens, int):
            self.default_max_tokens: ModelMap[int] = ModelMap({"*": default_max_tokens})
        else:
            self.default_max_tokens = ModelMap({"*": DEFAULT_MAX_TOKENS, **default_max_tokens})
        self.context_fallbacks = ModelMap(context_fallbacks)
        self.rate_limiter = rate_limiter
        self.use_server_context_windows = server_context_windows
        self.use_server_tokenize = server_tokenize
        self.estimator = EstimatingCounter()
        self.server_counter = ServerTokenizeCounter(
            self.estimator, retry_after=server_retry_after, timeout=lookup_timeout, clock=clock
        )
        self.server_context_windows = ServerContextWindows(
            ttl=server_cache_ttl,
            retry_after=server_retry_after,
            timeout=lookup_timeout,
            clock=clock,
        )
        self._bpe_directories = tuple(bpe_directories)
        self._tiktoken: dict[str, TokenCounter | None] = {}
        self._lock = fork_safe_lock()

    def adopt_clock(self, clock: ClockLike) -> None:
        """Read ``clock`` (the client's: ``Client`` calls this) in the lookups' and the
        rate limiter's bookkeeping, where no clock was given of their own."""
        self.server_counter.adopt_clock(clock)
        self.server_context_windows.adopt_clock(clock)
        if self.rate_limiter is not None:
            self.rate_limiter.adopt_clock(clock)

    def counter_for(self, model: str, *, base_url: str | httpx.URL | None = None) -> TokenCounter:
        """The counter that counts prompts for ``model`` (its ``name`` is reported)."""
        configured = self.counters.lookup(model)
        if configured is not None:
            return configured
        from ._models import encoding_name_for_model  # tiktoken's model table: on first use

        encoding = encoding_name_for_model(model)
        if encoding is not None:
            counter = self._tiktoken_counter(encoding)
            if counter is not None:
                return counter
        if base_url is not None and self.use_server_tokenize:
            return self.server_counter
        return self.estimator

    def precheck_flow(
        self,
        model: str,
        kind: Kind,
        body: Mapping[str, Any],
        *,
        base_url: str | httpx.URL | None = None,
        follow_fallbacks: bool = True,
    ) -> Flow[Precheck]:
        """Count the prompt, find the context window, and return a :class:`Precheck` or raise.

        Yields the few lookups it needs (``GET {base_url}/models``, ``POST
        /tokenize``) and is sent each response, or None when it failed; with
        ``base_url=None`` it asks no server. Raises
        :class:`~stormguard.ContextWindowExceededError` when prompt + max_tokens
        exceeds the context window of the model and of every context fallback.
        ``follow_fallbacks=False`` checks ``model`` alone: a client does, and moves the
        call to its context fallback itself, with its other fallbacks (``Fallbacks``).
        """
        request = read_request(kind, body)
        tried: list[tuple[str, int, int, int, str]] = []
        current = model
        while True:
            count = yield from self._count_flow(current, request, base_url)
            context_window, source = yield from self._context_window_flow(
                current, base_url, count.max_model_len
            )
            max_tokens = request.max_tokens
            if max_tokens is None:
                max_tokens = self.default_max_tokens.lookup(current) or DEFAULT_MAX_TOKENS
            if context_window is None or count.tokens + max_tokens <= context_window:
                return Precheck(
                    model=current,
                    prompt_tokens=count.tokens,
                    max_tokens=max_tokens,
                    context_window=context_window,
                    counter=count.counter,
                    fallback_from=model if current != model else None,
                    context_window_source=source,
                )
            tried.append((current, count.tokens, max_tokens, context_window, count.counter))
            if source == "server" and count.max_model_len is None and base_url is not None:
                self.server_context_windows.refused(base_url)
            fallback = self.context_fallbacks.lookup(current) if follow_fallbacks else None
            if fallback is None or fallback in {t[0] for t in tried}:
                raise _exceeded(tried, defaulted=request.max_tokens is None)
            current = fallback

    def precheck(self, model: str, kind: Kind, body: Mapping[str, Any]) -> Precheck:
        """:meth:`precheck_flow` without any server lookup (config, tiktoken, table only)."""
        flow = self.precheck_flow(model, kind, body, base_url=None)
        try:
            next(flow)
        except StopIteration as stop:
            result: Precheck = stop.value
            return result
        raise AssertionError("a pre-check without base_url asked for I/O")  # pragma: no cover

    def reserve(self, precheck: Precheck, max_wait: float | None = None) -> Reservation | None:
        """Reserve ``precheck.cost`` with the rate limiter (None when there is none)."""
        if self.rate_limiter is None:
            return None
        return self.rate_limiter.reserve(precheck.cost, max_wait)

    def _count_flow(
        self, model: str, request: PromptRequest, base_url: str | httpx.URL | None
    ) -> Flow[TokenCount]:
        counter = self.counter_for(model, base_url=base_url)
        if isinstance(counter, ServerTokenizeCounter) and base_url is not None:
            return (yield from counter.count_flow(request, model=model, base_url=base_url))
        if isinstance(counter, ServerTokenizeCounter):
            counter = counter.fallback
        return TokenCount(count_prompt(counter, request), counter.name)

    def _context_window_flow(
        self, model: str, base_url: str | httpx.URL | None, reported: int | None
    ) -> Flow[tuple[int | None, str | None]]:
        configured = self.context_windows.lookup(model)
        if configured is not None:
            return configured, "config"
        if reported is not None:
            return reported, "server"
        if base_url is not None and self.use_server_context_windows:
            served = yield from self.server_context_windows.context_window_flow(base_url, model)
            if served is not None:
                return served, "server"
        from ._context_windows import known_context_window  # the table: on first use

        known = known_context_window(model)
        return known, ("table" if known is not None else None)

    def _tiktoken_counter(self, encoding: str) -> TokenCounter | None:
        with self._lock:
            if encoding in self._tiktoken:
                return self._tiktoken[encoding]
        from ._bpe import BPEFileError
        from ._tiktoken_counter import TiktokenCounter

        counter: TokenCounter | None
        try:
            counter = TiktokenCounter(offline_encoding(encoding, directories=self._bpe_directories))
        except BPEFileError as exc:
            logger.warning("no exact counter for %s, counting conservatively: %s", encoding, exc)
            counter = None
        with self._lock:
            self._tiktoken[encoding] = counter
        return counter


def offline_encoding(name: str, *, directories: Sequence[str | Path] = ()) -> Encoding:
    """``_bpe.offline_encoding``, imported on first use: it loads tiktoken."""
    from ._bpe import offline_encoding as load

    return load(name, directories=directories)


def _exceeded(tried: list[tuple[str, int, int, int, str]], *, defaulted: bool) -> Exception:
    model, prompt_tokens, max_tokens, context_window, counter = tried[-1]
    message = (
        f"{model}: {prompt_tokens} prompt tokens + {max_tokens} max tokens = "
        f"{prompt_tokens + max_tokens} exceeds the context window of {context_window} tokens "
        f"(counted by {counter})"
    )
    if defaulted:
        message += f"; max_tokens was not set, {max_tokens} is the default completion length"
    if len(tried) > 1:
        message += "; context fallbacks tried: " + " -> ".join(t[0] for t in tried)
    return ContextWindowExceededError(
        message,
        model=model,
        prompt_tokens=prompt_tokens,
        max_tokens=max_tokens,
        context_window=context_window,
        counter=counter,
    )
