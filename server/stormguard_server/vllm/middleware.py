"""stormguard's admission layer in front of real vLLM, as a pure-ASGI middleware.

    python -m vllm.entrypoints.openai.api_server --model PATH \\
        --middleware stormguard_server.vllm.middleware.StormguardAdmission

(``stormguard-server --engine vllm --model PATH`` starts exactly that.) The
same ``AdmissionController`` as the reference server decides, for chat,
completions, Responses and embeddings requests alike: a request's cost is its
prompt tokens — counted with vLLM's own tokenizer and chat template — plus the
tokens it may generate (none for embeddings; ``costs.py``); the budget is vLLM's
KV capacity x the watermark; what does not fit waits in the bounded priority queue or is
shed with the same 503, ``x-load-shed``, ``x-should-retry`` and a Retry-After
from the measured hold times and the requests still running. A request whose
``x-request-deadline-ms`` cannot be met is refused at once; one whose caller
leaves while queued never reaches vLLM; once running, the middleware cancels
vLLM's handler when the client goes, and vLLM aborts the request in the engine
(about 0.1 s). Every response carries the load headers.

vLLM instantiates the middleware with the app only, so its settings come from
the environment: ``STORMGUARD_ADMISSION`` holds the ``AdmissionConfig`` as
JSON (the launcher writes it from the command line flags), and
``STORMGUARD_TRUST_PRIORITY_FROM`` and ``STORMGUARD_PRIORITY_TOKEN`` say whose
``x-priority: critical`` to believe (``priority_trust.py``; loopback only when
unset). Every request passes that gate first, so vLLM never sees the token.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
from collections.abc import Mapping
from dataclasses import fields
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from stormguard.protocol import (
    parse_attempt,
    parse_deadline_ms,
    parse_priority,
)
from stormguard_server.admission.controller import AdmissionController
from stormguard_server.admission.tickets import ShedError
from stormguard_server.clock import ClockLike, as_clock
from stormguard_server.config import AdmissionConfig
from stormguard_server.guards.priority_trust import PriorityTrust
from stormguard_server.http.disconnect import ClientGone, unless_disconnected
from stormguard_server.http.middleware import LoadHeadersMiddleware
from stormguard_server.http.refusals import (
    body_too_large_response,
    shed_error_response,
    too_long_refusal,
)
from stormguard_server.vllm.costs import ADMITTED_PATHS, Cost, request_cost
from stormguard_server.vllm.engine_load import VllmLoadReader

__all__ = ["ENV_ADMISSION", "StormguardAdmission", "admission_config_from_env"]

logger = logging.getLogger("stormguard_server.vllm")

ENV_ADMISSION = "STORMGUARD_ADMISSION"
_MAX_BODY_BYTES = 8 * 1024 * 1024
_TICK_S = 0.05
# AdmissionConfig fields renamed since the variable was first documented.
_RENAMED = {"drain_window_s": "drain_period_s"}


def admission_config_from_env(environ: Mapping[str, str] = os.environ) -> AdmissionConfig:
    """The admission settings the launcher left in ``STORMGUARD_ADMISSION`` (JSON)."""
    raw = environ.get(ENV_ADMISSION)
    if not raw:
        return AdmissionConfig()
    data = json.loads(raw)
    for old, new in _RENAMED.items():  # settings written under an earlier name
        if old in data and new not in data:
            data[new] = data.pop(old)
    known = {f.name for f in fields(AdmissionConfig)}
    unknown = set(data) - known
    if unknown:
        raise ValueError(f"{ENV_ADMISSION} has unknown settings: {sorted(unknown)}")
    return AdmissionConfig(**data)


class StormguardAdmission:
    """Token-weighted admission and load headers for vLLM's OpenAI server."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        clock: ClockLike | None = None,
        priority_trust: PriorityTrust | None = None,
    ) -> None:
        self.app = app
        self.config = admission_config_from_env()
        self.priority_trust = priority_trust or PriorityTrust.from_env()
        # x-priority claims above standard ignored (served as standard), this process.
        self.priority_claims_ignored = 0
        self._clock = as_clock(clock)
        self._controller: AdmissionController | None = None
        self._reader: VllmLoadReader | None = None
        self._ticker: asyncio.Task[None] | None = None
        self._with_headers = LoadHeadersMiddleware(app, self._load_headers)

    # -- setup on first use: the engine client exists only once vLLM has started --

    def _ensure(self, scope: Scope) -> AdmissionController | None:
        if self._controller is not None:
            return self._controller
        engine_client = getattr(scope["app"].state, "engine_client", None)
        if engine_client is None:
            return None
        self._reader = VllmLoadReader(engine_client, clock=self._clock)
        self._controller = AdmissionController(self.config, self._reader, clock=self._clock)
        self._ticker = asyncio.get_running_loop().create_task(self._tick_forever())
        capacity, block = self._reader.capacity_tokens()
        logger.info(
            "stormguard admission in front of vLLM: KV capacity %d tokens (blocks of %d),"
            " budget %d tokens",
            capacity,
            block,
            self._controller.full_budget(),
        )
        return self._controller

    async def _tick_forever(self) -> None:
        assert self._controller is not None
        while True:
            await self._clock.sleep(_TICK_S)
            try:
                self._controller.tick()
            except Exception:  # housekeeping must never die; the next tick retries
                logger.exception("admission tick failed")

    def _priority_claim_ignored(self) -> None:
        self.priority_claims_ignored += 1

    def _load_headers(self) -> dict[str, str]:
        if self._controller is None:
            return {}
        return self._controller.server_load().to_headers()

    async def _refuse(self, response: ASGIApp, scope: Scope, receive: Receive, send: Send) -> None:
        """Answer with ``response`` (an ASGI app) instead of vLLM, load headers included."""
        await LoadHeadersMiddleware(response, self._load_headers)(scope, receive, send)

    # -- ASGI ---------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        scope = self.priority_trust.gate(scope, self._priority_claim_ignored)
        controller = self._ensure(scope)
        if controller is None or scope["method"] != "POST" or scope["path"] not in ADMITTED_PATHS:
            await self._with_headers(scope, receive, send)
            return
        body = await _read_body(receive, _MAX_BODY_BYTES)
        if body is None:
            await self._refuse(body_too_large_response(_MAX_BODY_BYTES), scope, receive, send)
            return
        await self._admit(controller, scope, body, receive, send)

    async def _admit(
        self,
        controller: AdmissionController,
        scope: Scope,
        body: bytes,
        receive: Receive,
        send: Send,
    ) -> None:
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        try:
            request = json.loads(body)
        except ValueError:
            request = None
        cost = None
        if isinstance(request, dict):
            with contextlib.suppress(Exception):  # vLLM answers what it cannot parse
                cost = await asyncio.to_thread(self._cost, scope["path"], request)
        if cost is None:  # not ours to judge: vLLM validates and answers it
            await self._with_headers(scope, _replay(body, receive), send)
            return
        if cost.too_long is not None:
            refusal = too_long_refusal(cost.too_long, param=cost.param)
            await self._refuse(refusal, scope, receive, send)
            return
        ticket = controller.make_ticket(
            cost.tokens,
            priority=parse_priority(headers),
            attempt=parse_attempt(headers) or 1,
            deadline_ms=parse_deadline_ms(headers),
            max_tokens=cost.max_tokens,
        )
        try:
            grant = await unless_disconnected(receive, controller.acquire(ticket))
        except ShedError as exc:
            await self._refuse(shed_error_response(exc.shed), scope, receive, send)
            return
        except ClientGone:
            return  # the caller left while queued: vLLM never sees the request
        try:
            await _run_until_disconnect(self._with_headers, scope, body, receive, send)
        finally:
            controller.release(grant)

    def _cost(self, path: str, request: dict[str, Any]) -> Cost | None:
        """The request's cost as vLLM will count it; None when unknown."""
        assert self._reader is not None
        return request_cost(path, request, self._reader.tokenizer(), self._reader.max_model_len())


async def _run_until_disconnect(
    app: ASGIApp, scope: Scope, body: bytes, receive: Receive, send: Send
) -> None:
    """Run the app on the buffered request; cancel it the moment the client leaves.

    vLLM aborts a request whose handler is cancelled (``AsyncLLM.generate``), so
    this is what turns a caller's disconnect into an engine abort within one step.
    vLLM also watches for the disconnect itself, but not reliably behind a
    middleware that has read the body: seen here, one stream in eight ran to its
    full ``max_tokens`` after its client had gone. So one task reads the real
    ``receive`` and everyone else hears about the disconnect from it.
    """
    gone = asyncio.Event()
    body_sent = False

    async def app_receive() -> Message:
        nonlocal body_sent
        if not body_sent:
            body_sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    async def watch() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        gone.set()

    work = asyncio.ensure_future(app(scope, app_receive, send))
    watcher = asyncio.ensure_future(watch())
    try:
        await asyncio.wait({work, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not work.done():
            work.cancel()  # the client left (or we are cancelled): stop generating
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await watcher
    with contextlib.suppress(asyncio.CancelledError):
        await work  # re-raises the app's own errors


async def _read_body(receive: Receive, limit: int) -> bytes | None:
    """The whole request body, or None when it is larger than ``limit``."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return b"".join(chunks)
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def _replay(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that hands out the buffered body first, then the real messages
    (vLLM watches those for the client's disconnect)."""
    sent = False

    async def replayed() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed
