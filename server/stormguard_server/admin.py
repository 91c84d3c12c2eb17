"""The admin endpoint: switch faults of the sim engine while it runs.

Off unless ``--admin-port`` is given; the CLI then serves this app on
127.0.0.1 only (a second uvicorn server). Before any route runs,
``admin_guard`` refuses what a web page could send: a request needs a loopback
client, Host and Origin, the bearer token, and JSON when it has a body.
GETs only read. Routes:

- ``GET  /admin/faults``            the faults in force
- ``POST /admin/faults``            change ``error_rate``, ``hang_rate``, ``added_latency_ms``,
                                    ``oom_crash``
- ``POST /admin/stall``             freeze the engine loop for ``seconds``
- ``POST /admin/crash``             crash the engine now (as an OOM would); body ``{}``
- ``POST /admin/reset_prefix_cache`` empty the prefix cache when the engine is idle
                                    (``{"reset": false}`` otherwise); body ``{}``
- ``GET  /admin/engine``            live engine load and lifetime counters
- ``GET  /admin/quota``             the quota's limits and keys tracked (404 when off)
- ``POST /admin/quota``             switch ``insufficient_quota`` (every key out of credit)
"""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field

from stormguard_server.engine.faults import FaultState
from stormguard_server.guards.admin_guard import AdminGuardMiddleware, check_token
from stormguard_server.http.errors import error_response
from stormguard_server.state import ServerState


class FaultUpdate(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")

    error_rate: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    hang_rate: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    added_latency_ms: Annotated[float, Field(ge=0.0, le=3_600_000.0)] | None = None
    oom_crash: bool | None = None


class StallRequest(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")

    seconds: Annotated[float, Field(ge=0.0, le=3600.0)]


class QuotaUpdate(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")

    insufficient_quota: bool


class CrashRequest(BaseModel):
    """No fields: the body exists so that the POST is JSON, which a page cannot send
    without a CORS preflight."""

    model_config = ConfigDict(strict=True, extra="forbid")


def create_admin_app(state: ServerState, *, token: str) -> FastAPI:
    """The admin app over the same state as the main app, for holders of ``token``
    (ValueError if it is too weak: see ``admin_guard.check_token``)."""
    check_token(token)  # now, not at the first request (middleware is built lazily)
    app = FastAPI(title="stormguard admin", docs_url=None, redoc_url=None, openapi_url=None)

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, exc: RequestValidationError) -> Response:
        return error_response(400, str(exc.errors()[:1]), code="invalid_request")

    def faults() -> FaultState | Response:
        if state.faults is None:
            return error_response(404, "this engine has no injectable faults")
        return state.faults

    @app.get("/admin/faults")
    async def get_faults() -> Any:
        current = faults()
        return current if isinstance(current, Response) else dataclasses.asdict(current.snapshot())

    @app.post("/admin/faults")
    async def set_faults(update: FaultUpdate) -> Any:
        current = faults()
        if isinstance(current, Response):
            return current
        if update.error_rate is not None:
            current.set_error_rate(update.error_rate)
        if update.hang_rate is not None:
            current.set_hang_rate(update.hang_rate)
        if update.added_latency_ms is not None:
            current.set_added_latency(update.added_latency_ms / 1000.0)
        if update.oom_crash is not None:
            current.oom_crash = update.oom_crash
        return dataclasses.asdict(current.snapshot())

    @app.post("/admin/stall")
    async def stall(body: StallRequest) -> Any:
        current = faults()
        if isinstance(current, Response):
            return current
        current.stall(body.seconds)
        return dataclasses.asdict(current.snapshot())

    @app.post("/admin/crash")
    async def crash(body: CrashRequest) -> Any:
        current = faults()
        if isinstance(current, Response):
            return current
        current.request_crash()
        return {"crash": "requested"}

    @app.post("/admin/reset_prefix_cache")
    async def reset_prefix_cache(body: CrashRequest) -> Any:
        reset = getattr(state.engine, "reset_prefix_cache", None)
        if reset is None:
            return error_response(404, "this engine has no prefix cache to reset")
        return {"reset": reset()}

    @app.get("/admin/engine")
    async def engine() -> dict[str, Any]:
        load = state.engine.load()
        return {
            "load": dataclasses.asdict(load),
            "stats": dataclasses.asdict(state.engine.stats),
        }

    def quota_state() -> dict[str, Any] | Response:
        quota = state.quota
        if quota is None:
            return error_response(404, "this server has no quota (start it with --quota-tpm, ...)")
        return {
            **dataclasses.asdict(quota.config),
            "insufficient_quota": quota.insufficient_quota,
            "keys": len(quota),
            "keys_evicted": quota.evicted,
        }

    @app.get("/admin/quota")
    async def get_quota() -> Any:
        return quota_state()

    @app.post("/admin/quota")
    async def set_quota(update: QuotaUpdate) -> Any:
        if state.quota is not None:
            state.quota.insufficient_quota = update.insufficient_quota
        return quota_state()

    app.add_middleware(AdminGuardMiddleware, token=token)
    return app
