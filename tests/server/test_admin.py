"""The admin app answers only what a web page cannot send: a loopback client, Host and
Origin, the bearer token, JSON bodies; its GETs only read; its input is validated."""

from __future__ import annotations

from collections.abc import Mapping

import httpx
import pytest
from fastapi import FastAPI
from fastapi.routing import APIRoute

from stormguard_server import cli
from stormguard_server.admin import create_admin_app
from stormguard_server.app import build_state
from stormguard_server.config import ServerConfig
from stormguard_server.guards.admin_guard import ADMIN_TOKEN_ENV, is_loopback, refusal
from stormguard_server.state import ServerState

TOKEN = "tok-3f9a1c0e5b7d2e4f6a8c"
PORT = 8001
AUTH = {"authorization": f"Bearer {TOKEN}"}
JSON = {**AUTH, "content-type": "application/json"}


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


@pytest.fixture
def state() -> ServerState:
    return build_state(ServerConfig())


async def call(
    state: ServerState,
    method: str,
    path: str,
    *,
    headers: Mapping[str, str | bytes] = JSON,
    client_host: str = "127.0.0.1",
    **kw: object,
) -> httpx.Response:
    """One request to the admin app on 127.0.0.1:PORT; ``headers`` replace the defaults."""
    app = create_admin_app(state, token=TOKEN)
    transport = httpx.ASGITransport(app=app, client=(client_host, 5555))
    async with httpx.AsyncClient(transport=transport, base_url=f"http://127.0.0.1:{PORT}") as c:
        return await c.request(method, path, headers=dict(headers), **kw)  # type: ignore[arg-type]


def crash_pending(state: ServerState) -> bool:
    assert state.faults is not None
    pending: bool = state.faults.snapshot().crash_pending
    return pending


def assert_refused(response: httpx.Response, status: int, code: str) -> None:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"] == code and error["type"] == "invalid_request_error"
    assert TOKEN not in response.text


async def test_non_loopback_client_is_refused(state: ServerState) -> None:
    response = await call(state, "POST", "/admin/crash", client_host="10.1.2.3", json={})
    assert_refused(response, 403, "not_loopback")
    assert "loopback" in response.json()["error"]["message"]
    assert not crash_pending(state)


async def test_loopback_client_with_the_token_changes_faults(state: ServerState) -> None:
    response = await call(state, "POST", "/admin/faults", json={"error_rate": 0.25})
    assert response.status_code == 200 and response.json()["error_rate"] == 0.25
    bad = await call(state, "POST", "/admin/faults", json={"error_rate": "lots"})
    assert bad.status_code == 400
    unknown = await call(state, "POST", "/admin/faults", json={"bogus": 1})
    assert unknown.status_code == 400
    hang = await call(state, "POST", "/admin/faults", json={"hang_rate": 0.5})
    assert hang.status_code == 200 and hang.json()["hang_rate"] == 0.5
    too_much = await call(state, "POST", "/admin/faults", json={"hang_rate": 1.5})
    assert too_much.status_code == 400


@pytest.mark.parametrize(
    "authorization",
    [
        None,
        "",
        "Bearer",
        "Bearer ",
        "Bearer wrong-token-of-enough-length",
        f"Bearer {TOKEN}x",
        f"Bearer {TOKEN[:-1]}",
        f"Basic {TOKEN}",
        TOKEN,
        "Bearer tök-ünïcode-and-long-enough".encode(),  # not ASCII: refused, not a 500
        b"Bearer \xff\xfe-latin-1-bytes-long-enough",
    ],
    ids=repr,
)
async def test_a_missing_or_wrong_token_is_401(
    state: ServerState, authorization: str | bytes | None
) -> None:
    headers: dict[str, str | bytes] = {"content-type": "application/json"}
    if authorization is not None:
        headers["authorization"] = authorization
    response = await call(state, "POST", "/admin/crash", headers=headers, json={})
    assert_refused(response, 401, "invalid_admin_token")
    assert response.headers["www-authenticate"] == "Bearer"
    assert not crash_pending(state)


@pytest.mark.parametrize("scheme", ["Bearer", "bearer", "BEARER"])
async def test_the_right_token_is_accepted(state: ServerState, scheme: str) -> None:
    headers = {"authorization": f"{scheme} {TOKEN}", "content-type": "application/json"}
    response = await call(state, "POST", "/admin/crash", headers=headers, json={})
    assert response.status_code == 200 and response.json() == {"crash": "requested"}
    assert crash_pending(state)


@pytest.mark.parametrize(
    "host",
    ["127.0.0.1:8001", "127.0.0.1", "localhost:8001", "LocalHost", "[::1]:8001", "127.3.2.1:8001"],
)
async def test_a_loopback_host_is_accepted(state: ServerState, host: str) -> None:
    response = await call(state, "GET", "/admin/faults", headers={**AUTH, "host": host})
    assert response.status_code == 200


@pytest.mark.parametrize(
    "host",
    [
        "evil.example:8001",  # DNS rebinding: the name resolved to 127.0.0.1
        "evil.example",
        "127.0.0.1.evil.example:8001",
        "localhost.evil.example:8001",
        "app.localhost:8001",
        "127.0.0.1:8002",  # another port
        "localhost:80",
        "user@127.0.0.1:8001",
        "127.0.0.1:8001/path",
        "127.0.0.1:abc",
        "127.0.0.1:99999",
        "[::1",
        "0.0.0.0:8001",
        "10.0.0.1:8001",
        "",
    ],
)
async def test_a_foreign_host_is_403(state: ServerState, host: str) -> None:
    response = await call(state, "GET", "/admin/faults", headers={**AUTH, "host": host})
    assert_refused(response, 403, "forbidden_host")
    crash = await call(state, "POST", "/admin/crash", headers={**JSON, "host": host}, json={})
    assert_refused(crash, 403, "forbidden_host")
    assert not crash_pending(state)


@pytest.mark.parametrize(
    "headers",
    [
        [],  # HTTP/1.0 needs no Host
        [(b"host", b"127.0.0.1:8001"), (b"host", b"evil.example:8001")],
    ],
    ids=["none", "two"],
)
def test_no_host_or_two_hosts_are_refused(headers: list[tuple[bytes, bytes]]) -> None:
    scope = {
        "type": "http",
        "method": "GET",
        "client": ("127.0.0.1", 5555),
        "server": ("127.0.0.1", PORT),
        "headers": [*headers, (b"authorization", AUTH["authorization"].encode())],
    }
    refused = refusal(scope, TOKEN)
    assert refused is not None and refused.code == "forbidden_host"


@pytest.mark.parametrize(
    "origin",
    [
        "https://evil.example",
        "http://evil.example:8001",
        "http://127.0.0.1.evil.example",
        "null",  # sandboxed frames, file:// pages
        "file://",
        "ftp://localhost",
        "http://localhost:3000/page",
        "http://user@localhost:3000",
        "http://localhost:notaport",
        "",
    ],
)
async def test_a_foreign_origin_is_403(state: ServerState, origin: str) -> None:
    response = await call(
        state, "POST", "/admin/crash", headers={**JSON, "origin": origin}, json={}
    )
    assert_refused(response, 403, "forbidden_origin")
    assert not crash_pending(state)


@pytest.mark.parametrize(
    "origin",
    ["http://127.0.0.1:8001", "http://localhost:3000", "https://localhost", "http://[::1]:5173"],
)
async def test_a_loopback_origin_is_accepted(state: ServerState, origin: str) -> None:
    response = await call(
        state, "POST", "/admin/crash", headers={**JSON, "origin": origin}, json={}
    )
    assert response.status_code == 200
    assert crash_pending(state)


async def test_the_cross_site_attacks_are_refused(state: ServerState) -> None:
    # A "simple" request from any page: text/plain POST, no preflight, no token.
    simple = await call(
        state,
        "POST",
        "/admin/crash",
        headers={"content-type": "text/plain", "origin": "https://evil.example"},
        content=b"{}",
    )
    assert simple.status_code == 403
    # The same from a page that somehow knew the token (a preflight would stop it).
    with_token = await call(
        state,
        "POST",
        "/admin/crash",
        headers={**AUTH, "content-type": "text/plain", "origin": "https://evil.example"},
        content=b"{}",
    )
    assert with_token.status_code == 403
    # DNS rebinding: same-origin for the browser, so no Origin, but Host is the attacker's.
    rebound = await call(
        state, "GET", "/admin/faults", headers={**AUTH, "host": f"evil.example:{PORT}"}
    )
    assert rebound.status_code == 403
    assert not crash_pending(state)


@pytest.mark.parametrize(
    ("path", "body"),
    [("/admin/crash", b"{}"), ("/admin/faults", b'{"error_rate": 1}'), ("/admin/stall", b"{}")],
)
@pytest.mark.parametrize(
    "content_type",
    [None, "text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x",
     "application/jsonx", "application/json-patch+json"],
)  # fmt: skip
async def test_a_post_that_is_not_json_is_415(
    state: ServerState, path: str, body: bytes, content_type: str | None
) -> None:
    headers: dict[str, str | bytes] = dict(AUTH)
    if content_type is not None:
        headers["content-type"] = content_type
    assert state.faults is not None
    before = state.faults.snapshot()
    response = await call(state, "POST", path, headers=headers, content=body)
    assert_refused(response, 415, "unsupported_media_type")
    assert state.faults.snapshot() == before


@pytest.mark.parametrize("content_type", ["application/json", "Application/JSON; charset=utf-8"])
async def test_json_with_parameters_is_json(state: ServerState, content_type: str) -> None:
    headers = {**AUTH, "content-type": content_type}
    response = await call(state, "POST", "/admin/crash", headers=headers, content=b"{}")
    assert response.status_code == 200


@pytest.mark.parametrize("body", [b"", b"[]", b'{"now": true}', b"{"])
async def test_crash_takes_an_empty_object_only(state: ServerState, body: bytes) -> None:
    response = await call(state, "POST", "/admin/crash", content=body)
    assert response.status_code == 400
    assert not crash_pending(state)


def get_routes(app: FastAPI) -> set[str]:
    return {r.path for r in app.routes if isinstance(r, APIRoute) and "GET" in (r.methods or ())}


async def test_a_get_never_changes_state(state: ServerState) -> None:
    app = create_admin_app(state, token=TOKEN)
    # Reads only: a new GET route must be added here on purpose.
    assert get_routes(app) == {"/admin/faults", "/admin/engine", "/admin/quota"}
    assert state.faults is not None
    before = state.faults.snapshot()
    query = {
        "error_rate": "1",
        "seconds": "60",
        "added_latency_ms": "5000",
        "oom_crash": "false",
        "insufficient_quota": "true",
    }
    for path in ("/admin/faults", "/admin/engine", "/admin/crash", "/admin/stall", "/admin/quota"):
        response = await call(state, "GET", path, headers=AUTH, params=query)
        # /admin/quota: 404 on this server, which has no quota.
        assert response.status_code in (200, 404, 405), (path, response.status_code)
        head = await call(state, "HEAD", path, headers=AUTH, params=query)
        assert head.status_code in (200, 405)
    assert (await call(state, "GET", "/admin/crash", headers=AUTH)).status_code == 405
    assert state.faults.snapshot() == before


async def test_no_schema_is_served(state: ServerState) -> None:
    response = await call(state, "GET", "/openapi.json", headers=AUTH)
    assert response.status_code == 404


@pytest.mark.parametrize(
    "token",
    ["", "hunter2", "x" * 15, "has spaces in it, long", "tab\tinside-long-enough", "ü" * 20],
)
def test_a_weak_or_unsendable_token_is_refused(state: ServerState, token: str) -> None:
    with pytest.raises(ValueError, match="at least 16 visible ASCII") as refused:
        create_admin_app(state, token=token)
    assert not token or token not in str(refused.value)


def test_admin_token_flag_lands_in_the_config_and_not_in_repr() -> None:
    args = cli.build_parser().parse_args(["--admin-port", "9999", "--admin-token", TOKEN])
    config = cli.config_from_args(args)
    assert config.admin_token == TOKEN
    assert TOKEN not in repr(config)


def test_a_token_that_starts_with_a_dash_is_read_in_the_equals_form() -> None:
    """token_urlsafe starts one token in 64 with "-", which argparse reads as a flag."""
    token = "-" + TOKEN
    args = cli.build_parser().parse_args(["--admin-port", "9999", f"--admin-token={token}"])
    assert cli.config_from_args(args).admin_token == token


def test_a_weak_admin_token_flag_is_refused_without_quoting_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["--admin-port", "9999", "--admin-token", "hunter2"])
    err = capsys.readouterr().err
    assert "--admin-token" in err and "hunter2" not in err


def test_a_token_without_an_admin_port_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["--admin-token", TOKEN])
    err = capsys.readouterr().err
    assert "--admin-token needs --admin-port" in err and TOKEN not in err


def test_a_weak_token_in_the_environment_is_refused(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(ADMIN_TOKEN_ENV, "hunter2")
    with pytest.raises(SystemExit):
        cli.main(["--admin-port", "0"])
    err = capsys.readouterr().err
    assert ADMIN_TOKEN_ENV in err and "hunter2" not in err


def test_help_states_the_admin_rules(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["--help"])
    out = " ".join(capsys.readouterr().out.split())
    for rule in ("Authorization: Bearer TOKEN", "Origin", "localhost", "application/json",
                 ADMIN_TOKEN_ENV, "logged once at start"):  # fmt: skip
        assert rule in out, rule


async def test_reset_prefix_cache_empties_an_idle_engines_cache(state: ServerState) -> None:
    response = await call(state, "POST", "/admin/reset_prefix_cache", json={})
    assert response.status_code == 200 and response.json() == {"reset": True}
    refused = await call(state, "POST", "/admin/reset_prefix_cache", content=b'{"now": 1}')
    assert refused.status_code == 400
