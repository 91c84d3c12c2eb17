"""Who may drive the admin endpoint, decided before any route runs.

Listening on 127.0.0.1 keeps the network out, not the web pages a developer
visits: a browser on the same machine reaches loopback too. Each rule below
stops one way a page could drive the endpoint:

- the **client address** must be loopback (in case the app is ever served on
  another interface);
- the **Host** header must name loopback or ``localhost``, with the port the
  request arrived on or none: a DNS-rebound ``evil.example`` resolves to
  127.0.0.1, but the browser still sends ``Host: evil.example:PORT``;
- an **Origin** header, when present, must be a loopback origin: a browser
  names the page behind every cross-site request it sends;
- the **token**: ``Authorization: Bearer <token>``, compared in constant time. A
  page cannot read it, and cannot send the header without a CORS preflight;
- every request but GET and HEAD must be **JSON**: a ``text/plain`` POST is a
  "simple" request a browser sends without a preflight; a JSON one needs a
  preflight, which this app never approves.

Written by hand: Starlette's ``TrustedHostMiddleware`` matches names only (not
127.0.0.0/8, not the port) and refuses in plain text, and ``CORSMiddleware``
grants access rather than refusing it; neither answers in the OpenAI error shape.
"""

from __future__ import annotations

import hmac
import ipaddress
import re
from dataclasses import dataclass
from urllib.parse import SplitResult, urlsplit

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from stormguard_server.http.errors import error_response

# Where scripts put the token (argv is visible to every local user in ps).
ADMIN_TOKEN_ENV = "STORMGUARD_ADMIN_TOKEN"
MIN_TOKEN_CHARS = 16
_TOKEN = re.compile(r"[\x21-\x7e]+")  # visible ASCII: fits a header, no spaces to trim
_READS = frozenset({"GET", "HEAD"})


def check_token(token: str, *, what: str = "an admin token") -> str:
    """``token`` if it can guard the endpoint; ValueError (which never quotes it) if not."""
    if len(token) < MIN_TOKEN_CHARS or not _TOKEN.fullmatch(token):
        raise ValueError(
            f"{what} is at least {MIN_TOKEN_CHARS} visible ASCII characters, no spaces"
            " (e.g. python -c 'import secrets; print(secrets.token_hex(32))')"
        )
    return token


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


def _names_loopback(parts: SplitResult) -> tuple[bool, int | None]:
    """Whether a parsed ``host[:port]`` names loopback or localhost, and its port."""
    try:
        port = parts.port
    except ValueError:  # not a number, or out of range
        return False, None
    if parts.username is not None or parts.password is not None:
        return False, None
    name = parts.hostname or ""
    return name == "localhost" or is_loopback(name), port


def host_is_loopback(host: str, port: int | None) -> bool:
    """A Host header naming loopback or localhost, with ``port`` or no port."""
    try:
        parts = urlsplit(f"//{host}")
    except ValueError:  # e.g. an unclosed IPv6 bracket
        return False
    if parts.path or parts.query or parts.fragment:
        return False
    loopback, given = _names_loopback(parts)
    return loopback and given in (None, port)


def origin_is_loopback(origin: str) -> bool:
    """An Origin header of a page served from loopback or localhost (any port)."""
    try:
        parts = urlsplit(origin)
    except ValueError:
        return False
    if parts.scheme not in ("http", "https") or parts.path or parts.query or parts.fragment:
        return False
    return _names_loopback(parts)[0]


def bearer_matches(authorization: str | None, token: str) -> bool:
    """``Authorization: Bearer <token>``, compared in constant time."""
    if authorization is None:
        return False
    scheme, _, credentials = authorization.strip().partition(" ")
    if scheme.lower() != "bearer":
        return False
    # Header values arrive as latin-1 text: back to their bytes, so that any
    # input compares (compare_digest refuses non-ASCII str).
    return hmac.compare_digest(credentials.strip().encode("latin-1"), token.encode("ascii"))


def is_json(content_type: str | None) -> bool:
    """``application/json``, with or without parameters (``; charset=utf-8``)."""
    if content_type is None:
        return False
    return content_type.partition(";")[0].strip().lower() == "application/json"


@dataclass(frozen=True, slots=True)
class Refusal:
    """An answer in place of the route's: status, message and error code."""

    status: int
    message: str
    code: str


def refusal(scope: Scope, token: str) -> Refusal | None:
    """Why this HTTP request may not reach an admin route, or None if it may."""
    client = scope.get("client")
    if not is_loopback(client[0] if client else None):
        return Refusal(403, "the admin endpoint answers loopback clients only", "not_loopback")
    headers = Headers(scope=scope)
    server = scope.get("server")
    port = server[1] if server else None
    hosts = headers.getlist("host")
    if len(hosts) != 1 or not host_is_loopback(hosts[0], port):
        return Refusal(
            403,
            "the Host header must name 127.0.0.1, [::1] or localhost (with the admin port or none)",
            "forbidden_host",
        )
    if not all(origin_is_loopback(origin) for origin in headers.getlist("origin")):
        return Refusal(
            403,
            "cross-site requests are refused: Origin must be a loopback origin",
            "forbidden_origin",
        )
    if not bearer_matches(headers.get("authorization"), token):
        return Refusal(
            401,
            "the admin endpoint needs 'Authorization: Bearer <token>': the token given with "
            f"--admin-token or ${ADMIN_TOKEN_ENV}, or else the one the server logged at start",
            "invalid_admin_token",
        )
    if scope["method"] not in _READS and not is_json(headers.get("content-type")):
        return Refusal(
            415,
            "every admin request but a GET takes Content-Type: application/json",
            "unsupported_media_type",
        )
    return None


class AdminGuardMiddleware:
    """Answers every HTTP request that :func:`refusal` refuses, in the OpenAI error shape."""

    def __init__(self, app: ASGIApp, *, token: str) -> None:
        self.app = app
        self._token = check_token(token)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            refused = refusal(scope, self._token)
            if refused is not None:
                headers = {"www-authenticate": "Bearer"} if refused.status == 401 else None
                response = error_response(
                    refused.status, refused.message, code=refused.code, headers=headers
                )
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)
