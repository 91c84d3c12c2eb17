"""The token pre-check of a call: the flow of its lookups (counted as the
deployment the call will most likely go to knows the model, with that
deployment's credentials), and what a passed check reserves with the token rate
limiter.
"""

from __future__ import annotations

import math
from collections.abc import Generator, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING

from .._core.history import FallbackKind
from .._core.http import httpx
from .._policies.routing.base_url import normalize_base_url
from .._policies.routing.deployment import Deployment, is_account_header, with_query
from ..telemetry._events import PrecheckPassed
from .call_base import CallBase
from .prompt_view import precheck_view

if TYPE_CHECKING:
    from .._core.precheck import Precheck

__all__ = ["PrecheckFlow", "precheck_flow", "prechecked"]

PrecheckFlow = Generator[httpx.Request, "httpx.Response | None", "Precheck"]


def precheck_flow(call: CallBase) -> PrecheckFlow | None:
    """The token pre-check of this call (None when there is nothing to check): a
    flow the driver runs within the call's deadline (``drive_precheck_sync``/
    ``drive_precheck_async``, ``tokens/_flow.py``). It
    raises ``ContextWindowExceededError`` before any attempt is made; where the
    call goes then is the fallback's decision (``fall_back``), not the policy's."""
    policy = call.core.token_policy
    view = precheck_view(call.spec)  # what the check reads of the body (_call/prompt_view.py)
    if policy is None or view is None or call.spec.model is None:
        return None
    kind, body = view
    call.machine.step("precheck")
    target = _precheck_target(call, call.spec.model)
    base_url: str = call.core.base_url
    model = call.spec.model
    if target is not None:
        # Counted and looked up as the deployment the call will most likely go
        # to knows the model: by its name for it, at its URL.
        base_url, model = normalize_base_url(target.base_url)[0], target.model_for(model)
    flow = policy.precheck_flow(model, kind, body, base_url=base_url, follow_fallbacks=False)
    return _with_client_headers(call, flow, target)


def _precheck_target(call: CallBase, model: str) -> Deployment | None:
    """The deployment of the best tier serving ``model`` (the first listed on a tie);
    None when the first endpoint is a plain one."""
    endpoints = call.core.endpoints
    if not endpoints or not isinstance(endpoints[0], Deployment):
        return None
    serving = [e for e in endpoints if isinstance(e, Deployment) and e.serves(model)]
    return min(serving, key=lambda e: e.tier) if serving else endpoints[0]


def _with_client_headers(
    call: CallBase, flow: PrecheckFlow, target: Deployment | None
) -> PrecheckFlow:
    # The lookups (/models, /tokenize) need the credentials of the server they go
    # to: a deployment's own (and its query), never the client's key; the flow
    # itself knows nothing of them.
    base: Mapping[str, str] = call.core.headers
    names: tuple[str, ...] = ("authorization", "user-agent")
    if target is not None:
        base = call.core.provider_headers(target)
        names = (*(n for n in base if is_account_header(n)), "user-agent")
    try:
        request = next(flow)
        while True:
            for name in names:
                if name in base and name not in request.headers:
                    request.headers[name] = base[name]
            if target is not None and target.query:
                request.url = httpx.URL(with_query(str(request.url), target.query))
            request = flow.send((yield request))
    except StopIteration as stop:
        result: Precheck = stop.value
        return result


def prechecked(call: CallBase, check: Precheck) -> float:
    """Apply a passed pre-check: reserve the token cost with the rate limiter.
    Returns the seconds to wait for the rate limiter (raises
    ``TokenRateLimitedError`` when that wait would pass the deadline)."""
    moved = next((s for s in call.fallback_steps if s.kind is FallbackKind.CONTEXT_WINDOW), None)
    if check.model != call.spec.model or moved is not None:
        # The logical model (the check ran under a deployment's name for it), and
        # the model first asked for when a longer context serves the call.
        check = replace(
            check,
            model=call.spec.model or check.model,
            fallback_from=None if moved is None else moved.from_model,
        )
    call.precheck = check
    if call._reservation is not None:  # a fallback model's check replaces the last one
        call._reservation.cancel()
        call._reservation = None
    policy = call.core.token_policy
    if policy is None:
        return 0.0
    remaining = call.deadline.remaining()
    call._reservation = policy.reserve(
        check, max_wait=remaining if math.isfinite(remaining) else None
    )
    wait = call._reservation.wait if call._reservation is not None else 0.0
    if call._trace is not None:
        call._trace.on_event(
            PrecheckPassed(
                check.model,
                check.prompt_tokens,
                check.max_tokens,
                check.context_window,
                check.counter,
                wait,
            )
        )
    return wait
