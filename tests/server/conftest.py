"""In-process app fixtures: httpx over the ASGI transport, lifespan run by hand; on
the system clock, or on a ``FakeClock`` (``fake_clock.py``) given as ``clock``."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager

import httpx
import pytest

from stormguard_server.app import build_state, create_app
from stormguard_server.config import AdmissionConfig, ServerConfig, SimEngineConfig
from tests.server.fake_clock import FakeClock

FAST_ENGINE = SimEngineConfig(
    num_kv_blocks=64,
    block_size=16,
    max_model_len=512,
    max_num_seqs=8,
    max_num_batched_tokens=256,
    step_base_s=0.0005,
    prefill_token_s=0.0,
    decode_seq_s=0.0,
    restart_s=0.2,
    slow_start_s=0.0,
)

AppClient = Callable[..., AbstractAsyncContextManager[httpx.AsyncClient]]


@asynccontextmanager
async def app_client(
    *,
    admission: bool = True,
    max_body_bytes: int = 65_536,
    clock: FakeClock | None = None,
    **engine: object,
) -> AsyncIterator[httpx.AsyncClient]:
    config = ServerConfig(
        max_body_bytes=max_body_bytes,
        engine=dataclasses.replace(FAST_ENGINE, **engine),  # type: ignore[arg-type]
        admission=AdmissionConfig(enabled=admission),
    )
    state = build_state(config, clock=clock)
    app = create_app(state=state)
    if clock is not None:  # warm-up on the fake clock; the lifespan finds it started
        await clock.drive(state.engine.start())
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
            client.app = app  # type: ignore[attr-defined]
            yield client


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with app_client() as c:
        yield c


@pytest.fixture
def make_client() -> AppClient:
    return app_client
