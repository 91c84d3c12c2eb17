"""Run the reference server under uvicorn until interrupted.

The admin endpoint, when asked for, is a second uvicorn server bound to
127.0.0.1 only, behind a bearer token (``--admin-token``, else
``$STORMGUARD_ADMIN_TOKEN``, else a random one logged once at start).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import socket
from collections.abc import Callable, Generator
from typing import TYPE_CHECKING

import uvicorn

from stormguard_server.admin import create_admin_app
from stormguard_server.app import build_state, create_app
from stormguard_server.config import ServerConfig
from stormguard_server.http.connections import (
    ConnectionLimits,
    fit_to_fd_limit,
    summarize_accept_failures,
    uvicorn_config,
)
from stormguard_server.http.memory import return_freed_buffers_to_os
from stormguard_server.http.port_file import PortReport

if TYPE_CHECKING:
    from opentelemetry.trace import TracerProvider

    from stormguard_server.state import ServerState

logger = logging.getLogger("stormguard_server")


#: Connections the admin server keeps open at once (it serves a script or two).
_ADMIN_MAX_CONNECTIONS = 64


class _Server(uvicorn.Server):
    """Tells ``on_listening`` the port it bound (``--port 0``: one the OS chose)."""

    def __init__(self, config: uvicorn.Config, on_listening: Callable[[int], None]) -> None:
        super().__init__(config)
        self._on_listening = on_listening

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        if self.started:
            self._on_listening(self.servers[0].sockets[0].getsockname()[1])


class _AdminServer(_Server):
    """The admin server leaves signals to the main server, which stops it."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


async def serve(config: ServerConfig) -> None:
    """Run the main server (and the admin server, if enabled) until interrupted."""
    with _tracing(config) as tracer_provider:
        await _serve(build_state(config, tracer_provider=tracer_provider))


@contextlib.contextmanager
def _tracing(config: ServerConfig) -> Generator[TracerProvider | None, None, None]:
    """The OTLP tracer provider of ``--otlp-endpoint`` (flushed at exit), or None."""
    if config.otlp_endpoint is None:
        yield None
        return
    from stormguard.telemetry import configure_otlp

    setup = configure_otlp(
        config.otlp_endpoint, service_name="stormguard-server", metrics=False, set_global=False
    )
    try:
        yield setup.tracer_provider
    finally:
        setup.shutdown()


async def _serve(state: ServerState) -> None:
    config = state.config
    forwarded_from = config.priority_trust.forwarded_from
    return_freed_buffers_to_os()
    summarize_accept_failures(asyncio.get_running_loop())
    ports = PortReport(config.port_file, admin=config.admin_port is not None)
    main = _Server(
        uvicorn_config(
            create_app(state=state),
            host=config.host,
            port=config.port,
            limits=ConnectionLimits.for_server(config, fit_to_fd_limit(config.max_connections)),
            registry=state.metrics.registry,
            # The client is the peer, unless the peer is a proxy the operator named
            # (uvicorn's own default believes any proxy on this host).
            proxy_headers=bool(forwarded_from),
            forwarded_allow_ips=",".join(forwarded_from),
            log_config=None,
            access_log=config.access_log,
            timeout_graceful_shutdown=2,
            backlog=4096,
        ),
        on_listening=ports.main_listening,
    )
    logger.info(
        "starting stormguard-server",
        extra={
            "event": "server_start",
            "host": config.host,
            "port": config.port,
            "admission": config.admission.enabled,
            "kv_capacity_tokens": config.engine.kv_capacity_tokens,
            "oom_crash": config.engine.oom_crash,
            "admin_port": config.admin_port,
            "trust_priority_from": list(config.priority_trust.networks),
            "priority_token": config.priority_trust.token is not None,
        },
    )
    try:
        await _run(main, state, ports)
    finally:
        ports.remove()


async def _run(main: uvicorn.Server, state: ServerState, ports: PortReport) -> None:
    """The main server, with the admin server beside it when enabled."""
    config = state.config
    if config.admin_port is None:
        await main.serve()
        return
    admin = _AdminServer(
        uvicorn_config(
            create_admin_app(state, token=config.admin_token or _new_admin_token()),
            host="127.0.0.1",  # never configurable: faults are not for the network
            port=config.admin_port,
            # The same bounds on slow clients and heads; a handful of connections is all it needs.
            limits=ConnectionLimits.for_server(config, _ADMIN_MAX_CONNECTIONS),
            log_config=None,
            access_log=config.access_log,
            lifespan="off",
        ),
        on_listening=ports.admin_listening,
    )
    admin_task = asyncio.create_task(admin.serve())
    try:
        await main.serve()
    finally:
        admin.should_exit = True
        await admin_task


def _new_admin_token() -> str:
    """A random admin token, logged once: the only place it is ever written."""
    token = secrets.token_urlsafe(32)
    # At any --log-level: without this line nobody can use the endpoint.
    logger.log(
        max(logging.INFO, logger.getEffectiveLevel()),
        f"admin token: {token}",
        extra={"event": "admin_token", "admin_token": token},
    )
    return token
