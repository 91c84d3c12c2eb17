"""What an event or an error says as span attributes: an attempt's error type, a
load report, the retry budget, a pre-check, a refusal made before any I/O.

Plain functions of the events, with no OpenTelemetry import: ``_call_trace.py``
sets what they return.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from . import _names as n

if TYPE_CHECKING:
    from .._policies.retry.budget import BudgetSnapshot
    from ..protocol import ServerLoad
    from ._events import AttemptEnded, PrecheckPassed


def _attempt_error_type(event: AttemptEnded) -> str:
    """HTTP semantic conventions: the status code for an error status, else the exception."""
    if event.status_code is not None and event.status_code >= 400:
        return str(event.status_code)
    return event.error_type or "_OTHER"


def _short(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _load_attributes(load: ServerLoad, scrub: Callable[[str], str]) -> dict[str, Any]:
    pairs = (
        (n.LOAD_QUEUE_DEPTH, load.queue_depth),
        (n.LOAD_QUEUE_TOKENS, load.queue_tokens),
        (n.LOAD_INFLIGHT_TOKENS, load.inflight_tokens),
        (n.LOAD_TOKEN_CAPACITY, load.token_capacity),
        (n.LOAD_KV_CACHE_USAGE, load.kv_cache_usage),
        (n.LOAD_RETRY_AFTER, load.retry_after),
        (n.LOAD_SHOULD_RETRY, load.should_retry),
        (n.LOAD_SHED, None if load.load_shed is None else scrub(load.load_shed)),
    )
    return {key: value for key, value in pairs if value is not None}


def _budget_attributes(budget: BudgetSnapshot) -> dict[str, Any]:
    return {
        n.BUDGET_CALLS: budget.calls,
        n.BUDGET_RETRIES: budget.retries,
        n.BUDGET_AVAILABLE: budget.available,
        n.BUDGET_REFUSED: budget.refused,
    }


def _precheck_attributes(event: PrecheckPassed) -> dict[str, Any]:
    attributes: dict[str, Any] = {
        n.TOKENS_PROMPT: event.prompt_tokens,
        n.TOKENS_MAX: event.max_tokens,
        n.TOKENS_COUNTER: event.counter,
        n.TOKENS_RATE_LIMIT_WAIT: event.rate_limit_wait,
    }
    if event.context_window is not None:
        attributes[n.TOKENS_CONTEXT_WINDOW] = event.context_window
    return attributes


def _refusal_attributes(error: BaseException | None) -> dict[str, Any]:
    """What a refusal made before any I/O says (the logical span has no attempt then)."""
    # Imported here: the exception classes are plain Python, but keeping this module's
    # import surface small keeps ``import stormguard`` fast.
    from .._core.exceptions import (
        CircuitOpenError,
        ContextWindowExceededError,
        ThrottledError,
        TokenRateLimitedError,
    )

    if isinstance(error, CircuitOpenError):
        attributes: dict[str, Any] = {n.BREAKER_NAME: error.breaker, n.BREAKER_STATE: "open"}
        if error.retry_in is not None:
            attributes[n.BREAKER_RETRY_IN] = error.retry_in
        return attributes
    if isinstance(error, ContextWindowExceededError):
        return {
            n.TOKENS_PROMPT: error.prompt_tokens,
            n.TOKENS_MAX: error.max_tokens,
            n.TOKENS_CONTEXT_WINDOW: error.context_window,
            n.TOKENS_COUNTER: error.counter,
        }
    if isinstance(error, TokenRateLimitedError):
        return {n.TOKENS_PROMPT: error.tokens, n.TOKENS_RATE_LIMIT_WAIT: error.wait}
    if isinstance(error, ThrottledError):
        return {n.THROTTLE_PROBABILITY: error.probability}
    return {}
