"""Which replica each attempt of a call went to, and when: the client process's record.

The fleet scenario asks of every logical call which replicas its attempts touched, and
when, including attempts no server saw (a refused connection). Each client reports
its attempts where it sends them, into the record of the logical call running in the
current context (a ``ContextVar``: a call's asyncio task, and whatever it spawns or
runs in a thread with a copy of its context, shares the call's list):

- openai-python and stormguard: an httpx request hook, on the completion routes only
  (stormguard's token pre-check lookups are not attempts);
- LiteLLM: a ``CustomLogger``'s ``log_pre_api_call``, which LiteLLM calls once per
  deployment attempt with the deployment's ``api_base``.

At a live replica the record agrees with the replica's own ``stormguard_attempts_total``
(the fleet summary reports both).
"""

from __future__ import annotations

import time
from contextvars import ContextVar
from typing import Any

import httpx

# (time.monotonic() of the attempt, "host:port" it went to)
Attempt = tuple[float, str]

_CALL: ContextVar[list[Attempt] | None] = ContextVar("drill_call_attempts", default=None)
_COMPLETION_ROUTES = ("/chat/completions", "/completions")


def new_call() -> list[Attempt]:
    """Start the record of a logical call in the current context; returns its list."""
    attempts: list[Attempt] = []
    _CALL.set(attempts)
    return attempts


def record(url: str | httpx.URL) -> None:
    """File an attempt to ``url`` under the current call (none running: ignored)."""
    attempts = _CALL.get()
    if attempts is None:
        return
    parsed = httpx.URL(str(url))
    if parsed.path.rstrip("/").endswith(_COMPLETION_ROUTES):
        attempts.append((time.monotonic(), f"{parsed.host}:{parsed.port}"))


async def httpx_hook(request: Any) -> None:
    """An httpx (or openai's httpx2) ``event_hooks["request"]`` entry."""
    record(str(request.url))


def litellm_logger() -> Any:
    """A LiteLLM ``CustomLogger`` that records each deployment attempt (LiteLLM is
    imported by the caller first: ``litellm_client.import_litellm``)."""
    from litellm.integrations.custom_logger import CustomLogger

    class _AttemptLogger(CustomLogger):
        def log_pre_api_call(self, model: Any, messages: Any, kwargs: Any) -> None:
            params = kwargs.get("litellm_params") or {}
            base = kwargs.get("api_base") or params.get("api_base")
            if base:
                record(f"{str(base).rstrip('/')}/chat/completions")

    return _AttemptLogger()
