"""The admin endpoint: switch faults of the sim engine while it runs.

Off unless ``--admin-port`` is given; the CLI then serves this app on
127.0.0.1 only (a second uvicorn server), and the app itself also refuses
any client that is not on a loopback address, in case it is ever mounted
elsewhere. Routes:

- ``GET  /admin/faults``            the faults in force
- ``POST /admin/faults``            change ``error_rate``, ``added_latency_ms``, ``oom_crash``
- ``POST /admin/stall``             freeze the engine loop for ``seconds``
- ``POST /admin/crash``             crash the engine now (as an OOM would)
- ``GET  /admin/engine``            live engine load and lifetime counters
"""

from __future__ import annotations

import dataclasses
import ipaddress
from typing import Annotated, Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field
from starlette.types import ASGIApp, Receive, Scope, Send

from stormguard_server.errors import error_response
from stormguard_server.faults import FaultState
from stormguard_server.state import ServerState


class FaultUpdate(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")

    error_rate: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    added_latency_ms: Annotated[float, Field(ge=0.0, le=3_600_000.0)] | None = None
    oom_crash: bool | None = None


class StallRequest(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")

    seconds: Annotated[float, Field(ge=0.0, le=3600.0)]


def is_loopback(host: str | None) -> bool:
    """True for 127.0.0.0/8 and ::1 (and IPv4-mapped loopback)."""
    if not host:
        return False
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped.is_loopback
    return address.is_loopback


class LoopbackOnlyMiddleware:
    """403 for any client whose address is not loopback."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            client = scope.get("client")
            if not is_loopback(client[0] if client else None):
                response = error_response(403, "the admin endpoint answers loopback clients only")
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


def create_admin_app(state: ServerState) -> FastAPI:
    """The admin app over the same state as the main app."""
    app = FastAPI(title="stormguard admin", docs_url=None, redoc_url=None)

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
    async def crash() -> Any:
        current = faults()
        if isinstance(current, Response):
            return current
        current.request_crash()
        return {"crash": "requested"}

    @app.get("/admin/engine")
    async def engine() -> dict[str, Any]:
        load = state.engine.load()
        return {
            "load": dataclasses.asdict(load),
            "stats": dataclasses.asdict(state.engine.stats),
        }

    app.add_middleware(LoopbackOnlyMiddleware)
    return app
