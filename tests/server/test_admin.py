"""The admin app refuses non-loopback clients and validates its input."""

from __future__ import annotations

import httpx
import pytest

from stormguard_server.admin import create_admin_app, is_loopback
from stormguard_server.app import build_state
from stormguard_server.config import ServerConfig


@pytest.mark.parametrize(
    ("host", "ok"),
    [
        ("127.0.0.1", True),
        ("127.8.9.10", True),
        ("::1", True),
        ("::ffff:127.0.0.1", True),
        ("10.0.0.1", False),
        ("192.168.1.5", False),
        ("8.8.8.8", False),
        ("localhost", False),  # a name is not an address
        ("", False),
        (None, False),
    ],
)
def test_is_loopback(host: str | None, ok: bool) -> None:
    assert is_loopback(host) is ok


async def call(client_host: str, method: str, path: str, **kw: object) -> httpx.Response:
    app = create_admin_app(build_state(ServerConfig()))
    transport = httpx.ASGITransport(app=app, client=(client_host, 5555))
    async with httpx.AsyncClient(transport=transport, base_url="http://admin") as client:
        return await client.request(method, path, **kw)  # type: ignore[arg-type]


async def test_non_loopback_client_is_refused() -> None:
    response = await call("10.1.2.3", "POST", "/admin/crash")
    assert response.status_code == 403
    assert "loopback" in response.json()["error"]["message"]


async def test_loopback_client_changes_faults() -> None:
    response = await call("127.0.0.1", "POST", "/admin/faults", json={"error_rate": 0.25})
    assert response.status_code == 200 and response.json()["error_rate"] == 0.25
    bad = await call("127.0.0.1", "POST", "/admin/faults", json={"error_rate": "lots"})
    assert bad.status_code == 400
    unknown = await call("127.0.0.1", "POST", "/admin/faults", json={"bogus": 1})
    assert unknown.status_code == 400
