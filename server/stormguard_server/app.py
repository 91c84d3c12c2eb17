"""The OpenAI-compatible HTTP app: routes, error handlers, middlewares, lifespan.

Routes stay thin: validate (pydantic), build the prompt, hand over to
``generation.serve_generation``. Every error is an OpenAI-style body with a
4xx/5xx status; bad input never becomes a 500.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, Literal

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.convertors import PathConvertor, register_url_convertor
from starlette.exceptions import HTTPException as StarletteHTTPException

from stormguard import __version__
from stormguard_server.admission.controller import AdmissionController
from stormguard_server.api.embeddings import serve_embeddings
from stormguard_server.api.generation import serve_generation, size_call
from stormguard_server.api.openai_format import ChoicesAnswer
from stormguard_server.api.responses import serve_responses
from stormguard_server.api.schemas import (
    ChatCompletionRequest,
    CompletionRequest,
    EmbeddingRequest,
    ResponsesRequest,
    TokenizeRequest,
)
from stormguard_server.api.structured import Plan, Refused, off_the_loop, seed_of
from stormguard_server.api.structured import plan as decide
from stormguard_server.api.tool_requests import chat_spec, chat_turns
from stormguard_server.clock import ClockLike, as_clock
from stormguard_server.config import ServerConfig
from stormguard_server.engine.base import Engine
from stormguard_server.engine.faults import FaultState
from stormguard_server.engine.sim_engine import SimEngine
from stormguard_server.guards.priority_trust import PriorityGate, PriorityTrust
from stormguard_server.http.errors import error_response
from stormguard_server.http.json_response import JSONResponse
from stormguard_server.http.middleware import (
    BodyLimitMiddleware,
    ErrorBoundaryMiddleware,
    LoadHeadersMiddleware,
    ResponseCountMiddleware,
)
from stormguard_server.http.refusals import refusal_headers
from stormguard_server.http.request_id import RequestIdMiddleware
from stormguard_server.http.request_limits import RequestLimits, RequestLimitsConfig
from stormguard_server.quota.buckets import Quota
from stormguard_server.quota.http import QuotaCollector, QuotaHeadersMiddleware
from stormguard_server.state import ServerState, get_state
from stormguard_server.telemetry.metrics import ServerMetrics
from stormguard_server.telemetry.tracing import ServerTracing, TraceMiddleware

if TYPE_CHECKING:
    from opentelemetry.trace import TracerProvider

_CREATED = int(time.time())


class _ModelIdConvertor(PathConvertor):
    """A model id in a path: any text, slashes included (``org/model``, as vLLM serves
    them) and line breaks too (Starlette's ``path`` stops at one, so a ``$`` matched
    before a final newline and the id lost it)."""

    regex = "(?s:.+)"


register_url_convertor("model_id", _ModelIdConvertor())


def build_state(
    config: ServerConfig,
    *,
    engine: Engine | None = None,
    faults: FaultState | None = None,
    tracer_provider: TracerProvider | None = None,
    clock: ClockLike | None = None,
) -> ServerState:
    """Wire engine, faults, admission and metrics for ``config``; with a tracer
    provider, server spans too (children of each client attempt's span). Every part
    reads ``clock`` (default: the system's), so a test can hand in a fake one; an
    ``engine`` or ``faults`` given here should have been built with the same clock."""
    clock = as_clock(clock)
    if engine is None:
        faults = faults or FaultState(config.faults, oom_crash=config.engine.oom_crash, clock=clock)
        engine = SimEngine(config.engine, faults, clock=clock)
    admission = (
        AdmissionController(config.admission, engine.load, clock=clock)
        if config.admission.enabled
        else None
    )
    metrics = ServerMetrics(
        engine.load,
        lambda: engine.stats,
        (lambda: admission.server_load()) if admission is not None else (lambda: None),
    )
    tracing = ServerTracing(tracer_provider, clock=clock) if tracer_provider is not None else None
    quota = Quota(config.quota, clock=clock) if config.quota.enabled else None
    if quota is not None:
        metrics.registry.register(QuotaCollector(quota))
    return ServerState(
        config, engine, faults, admission, metrics, tracing=tracing, clock=clock, quota=quota
    )


def create_app(
    config: ServerConfig | None = None,
    *,
    state: ServerState | None = None,
) -> FastAPI:
    """The app for ``config`` (or for an already built ``state``, shared with the admin app)."""
    state = state or build_state(config or ServerConfig())

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await state.engine.start()
        ticker = asyncio.create_task(_admission_ticker(state), name="admission-ticker")
        try:
            yield
        finally:
            ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await ticker
            await state.engine.stop()
            if state.tracing is not None:
                await asyncio.to_thread(state.tracing.flush)

    app = FastAPI(
        default_response_class=JSONResponse,
        title="stormguard reference server",
        version=__version__,
        description="OpenAI-compatible API over a simulated continuous-batching engine, "
        "with token-weighted admission and load headers (docs/protocol.md).",
        lifespan=lifespan,
    )
    app.state.stormguard = state
    _install_error_handlers(app)
    _install_routes(app)
    # Each add_middleware wraps the ones before it: the last added sees a request first.
    app.add_middleware(BodyLimitMiddleware, max_bytes=state.config.max_body_bytes)
    app.add_middleware(ErrorBoundaryMiddleware)
    app.add_middleware(LoadHeadersMiddleware, headers=state.load_headers)
    if state.quota is not None:  # x-ratelimit-* on every answer of a keyed route
        app.add_middleware(QuotaHeadersMiddleware, quota=state.quota)
    if state.tracing is not None:  # the request span covers everything but the count
        app.add_middleware(TraceMiddleware, tracer=state.tracing.tracer)
    # A raised x-priority only from trusted callers, and never the token past here
    # (priority_trust.py): before anything that reads them, the span included.
    app.add_middleware(
        PriorityGate,
        trust=PriorityTrust.from_config(state.config.priority_trust),
        on_ignored=state.metrics.priority_claims_ignored.inc,
    )
    # Requests served at once and the body bytes they hold (request_limits.py): before
    # any other work, and inside the count, so its 503s are counted like any answer.
    app.add_middleware(
        RequestLimits,
        config=RequestLimitsConfig.for_server(state.config),
        load_headers=state.load_headers,
        shed_headers=state.admission is not None,
        registry=state.metrics.registry,
        clock=state.clock,
    )
    # Every answer names itself (an unknown route's 404 and the limits' 503s too).
    app.add_middleware(RequestIdMiddleware)
    # Outermost, so that every status a client gets is counted: the error boundary's
    # 500 too, and the one Starlette sends for an error that escapes everything.
    app.add_middleware(
        ResponseCountMiddleware,
        count=lambda route, status: state.metrics.responses.labels(route, str(status)).inc(),
        routes=frozenset(r.path for r in app.routes if hasattr(r, "path")),
    )
    return app


async def _admission_ticker(state: ServerState) -> None:
    if state.admission is None:
        return
    while True:
        await state.clock.sleep(state.config.admission_tick_s)
        state.admission.tick()


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def invalid_request(_: Request, exc: RequestValidationError) -> Response:
        errors = exc.errors()
        first: dict[str, Any] = errors[0] if errors else {}
        loc = [str(part) for part in first.get("loc", ()) if part != "body"]
        where = ".".join(loc)
        message = str(first.get("msg", "invalid request"))
        if first.get("type") == "json_invalid":
            where, message = (
                "",
                f"malformed JSON body ({first.get('ctx', {}).get('error', message)})",
            )
        return error_response(
            400,
            f"{where}: {message}" if where else message,
            code="invalid_request",
            param=where or None,
        )

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: StarletteHTTPException) -> Response:
        return error_response(exc.status_code, str(exc.detail), headers=exc.headers)


def _resolve_model(state: ServerState, requested: str | None) -> str | Response:
    if requested is None or requested in state.served_models:
        return requested or state.engine.model
    return error_response(
        404,
        f"The model `{requested}` does not exist.",
        code="model_not_found",
        param="model",
    )


async def _generate(
    state: ServerState,
    request: Request,
    body: ChatCompletionRequest | CompletionRequest,
    *,
    kind: Literal["chat", "completion"],
    model: str,
    prompt: str,
    plan: Plan | None = None,
) -> Response:
    """Size, admit and serve one chat or text completion (a chat one as ``plan`` says:
    tool calls, a JSON document or text)."""
    plan = plan or Plan()
    answer = ChoicesAnswer(kind, include_usage=body.include_usage, plan=plan)
    call = size_call(
        state,
        kind=kind,
        model=model,
        prompt=prompt,
        requested_max_tokens=body.requested_max_tokens(),
        stop=body.stop_strings(),
        ignore_eos=body.ignore_eos,
        answer=answer,
        stream=answer if body.stream else None,
        headers=request.headers,
        prompt_param="messages" if kind == "chat" else "prompt",
        script=plan.script,
    )
    if isinstance(call, Response):
        return call
    return await serve_generation(state, call, request.receive)


def _install_routes(app: FastAPI) -> None:
    @app.post("/v1/chat/completions", tags=["openai"])
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        state = get_state(request)
        model = _resolve_model(state, body.model)
        if isinstance(model, Response):
            return model

        def decided() -> tuple[str, Plan]:
            spec = chat_spec(body)
            prompt = state.engine.chat_prompt(
                [*spec.prompt_lines(), *((m.role, m.text()) for m in body.messages)],
                add_generation_prompt=True,
            )
            last_role, user_text = chat_turns(body.messages)
            seed = seed_of(prompt, state.config.engine.seed)
            return prompt, decide(spec, last_role=last_role, user_text=user_text, seed=seed)

        heavy = bool(body.tools) or body.response_format is not None
        try:
            prompt, plan = await off_the_loop(decided, heavy=heavy)
        except Refused as exc:
            return error_response(400, exc.message, code="invalid_request", param=exc.param)
        return await _generate(
            state, request, body, kind="chat", model=model, prompt=prompt, plan=plan
        )

    @app.post("/v1/completions", tags=["openai"])
    async def completions(body: CompletionRequest, request: Request) -> Response:
        state = get_state(request)
        model = _resolve_model(state, body.model)
        if isinstance(model, Response):
            return model
        prompt = body.prompt_text()
        return await _generate(state, request, body, kind="completion", model=model, prompt=prompt)

    @app.post("/v1/embeddings", tags=["openai"])
    async def embeddings(body: EmbeddingRequest, request: Request) -> Response:
        state = get_state(request)
        model = _resolve_model(state, body.model)
        if isinstance(model, Response):
            return model
        return await serve_embeddings(
            state, body, model=model, headers=request.headers, receive=request.receive
        )

    @app.post("/v1/responses", tags=["openai"])
    async def responses(body: ResponsesRequest, request: Request) -> Response:
        state = get_state(request)
        model = _resolve_model(state, body.model)
        if isinstance(model, Response):
            return model
        return await serve_responses(
            state, body, model=model, headers=request.headers, receive=request.receive
        )

    @app.get("/v1/models", tags=["openai"])
    async def list_models(request: Request) -> dict[str, Any]:
        state = get_state(request)
        return {"object": "list", "data": [_model_card(state, m) for m in state.served_models]}

    @app.get("/v1/models/{model:model_id}", tags=["openai"])
    async def retrieve_model(model: str, request: Request) -> Response:
        state = get_state(request)
        resolved = _resolve_model(state, model)
        if isinstance(resolved, Response):
            return resolved
        return JSONResponse(_model_card(state, resolved))

    @app.post("/tokenize", tags=["vllm"])
    async def tokenize(body: TokenizeRequest, request: Request) -> Response:
        state = get_state(request)
        model = _resolve_model(state, body.model)
        if isinstance(model, Response):
            return model
        if body.messages is not None:
            prompt = state.engine.chat_prompt(
                [(m.role, m.text()) for m in body.messages],
                add_generation_prompt=body.add_generation_prompt,
            )
        elif body.prompt is not None:
            prompt = body.prompt
        else:
            return error_response(400, "give `prompt` or `messages`", code="invalid_request")
        tokens = state.engine.encode(prompt)
        return JSONResponse(
            {"count": len(tokens), "max_model_len": state.engine.max_model_len, "tokens": tokens}
        )

    @app.get("/health", tags=["ops"])
    async def health() -> dict[str, str]:
        """Alive: the process answers (even while the engine restarts)."""
        return {"status": "ok"}

    @app.get("/ready", tags=["ops"])
    async def ready(request: Request) -> Response:
        """Ready: the engine is warm and requests are admitted."""
        state = get_state(request)
        load = state.engine.load()
        body = {"ready": load.ready, "state": load.state}
        if load.ready:
            return JSONResponse(body)
        headers: dict[str, str] = {}
        if state.admission is not None:
            shed = state.admission.unready_shed(load)
            headers = refusal_headers(shed.reason, shed.retry_after_s, shed.should_retry)
        return JSONResponse(body, status_code=503, headers=headers)

    @app.get("/metrics", tags=["ops"])
    async def metrics(request: Request) -> Response:
        state = get_state(request)
        return Response(generate_latest(state.metrics.registry), media_type=CONTENT_TYPE_LATEST)


def _model_card(state: ServerState, name: str) -> dict[str, Any]:
    return {
        "id": name,
        "object": "model",
        "created": _CREATED,
        "owned_by": "stormguard",
        "root": state.engine.model,
        "parent": None,
        "max_model_len": state.engine.max_model_len,
        "permission": [],
    }
