"""Who may raise a request's priority: ``x-priority: critical`` from trusted callers only.

Admission serves ``critical`` first and sheds it last, so a caller free to claim
it pushes everyone else out: 60 late "critical" calls all succeeded while 106 of
120 earlier standard ones were shed. So a claim above ``standard`` is believed
only from a trusted caller:

- one whose **address** is in a trusted network: the peer's address, which a
  client cannot choose; a proxy's ``X-Forwarded-For`` counts only when the
  operator names that proxy (``--trust-forwarded-from``, which sets uvicorn's
  ``forwarded_allow_ips``), or
- one that sends the **shared token** in ``x-priority-token`` (compared in
  constant time), for callers whose address says nothing (behind a proxy, in
  a shared network).

From anyone else the claim is dropped before the app (the request is
``standard``) and counted. ``standard`` and ``sheddable`` are always kept:
asking for less can hurt no other caller, and a batch client must be able to
mark itself sheddable. ``x-priority-token`` is always removed, so the token
reaches no route, log, span or engine behind the gate.

The default trusts loopback only (``127.0.0.0/8``, ``::1``): the server listens
on 127.0.0.1 unless told otherwise, so a laptop, the drill and the tests behave
as before, while a server bound to a public address believes no remote caller
until the operator says which. Envoy did the same for its internal headers,
once trusting every RFC 1918 address by default; a 2024 security advisory made
it trust none unless configured, since anyone on a private network could set
them. A proxy on the same host makes every request come from loopback: there,
trust no network (``--trust-priority-from none``) and give the trusted callers
the token, or name the proxy in ``--trust-forwarded-from``.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
import os
from collections.abc import Callable, Iterable, Mapping

from starlette.types import ASGIApp, Receive, Scope, Send

from stormguard.protocol import HEADER_PRIORITY, Priority
from stormguard_server.config import LOOPBACK_NETWORKS, PriorityTrustConfig
from stormguard_server.guards.admin_guard import check_token

__all__ = [
    "HEADER_PRIORITY_TOKEN",
    "PRIORITY_TOKEN_ENV",
    "TRUST_PRIORITY_ENV",
    "PriorityGate",
    "PriorityTrust",
    "parse_networks",
    "split_networks",
]

logger = logging.getLogger("stormguard_server.priority")

HEADER_PRIORITY_TOKEN = "x-priority-token"
# The same settings for the admission middleware inside vLLM (the launcher writes them).
TRUST_PRIORITY_ENV = "STORMGUARD_TRUST_PRIORITY_FROM"
PRIORITY_TOKEN_ENV = "STORMGUARD_PRIORITY_TOKEN"

Network = ipaddress.IPv4Network | ipaddress.IPv6Network

_PRIORITY = HEADER_PRIORITY.encode()
_TOKEN = HEADER_PRIORITY_TOKEN.encode()
# Claims that need trust: every priority served before standard.
_RAISED = frozenset(p.value.encode() for p in Priority if p.rank < Priority.STANDARD.rank)


def parse_networks(items: Iterable[str]) -> tuple[Network, ...]:
    """Each item a network (``10.0.0.0/8``) or one address; ``none`` names no network.
    ValueError naming the first that is neither (host bits set included: a typo)."""
    networks: list[Network] = []
    for item in items:
        text = item.strip()
        if text.lower() == "none":
            continue
        try:
            networks.append(ipaddress.ip_network(text))
        except ValueError as exc:
            raise ValueError(f"not a network: {text!r} ({exc})") from None
    return tuple(networks)


def split_networks(text: str) -> list[str]:
    """A comma-separated list of networks, each checked, in their canonical form."""
    return [str(net) for net in parse_networks(part for part in text.split(",") if part.strip())]


class PriorityTrust:
    """The trusted networks and token, and the gate each request passes (module doc)."""

    def __init__(self, networks: Iterable[str] = LOOPBACK_NETWORKS, token: str | None = None):
        self.networks = parse_networks(networks)
        self._token = check_token(token, what="a priority token").encode() if token else None
        self._warned = False

    @classmethod
    def from_config(cls, config: PriorityTrustConfig) -> PriorityTrust:
        return cls(config.networks, config.token)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> PriorityTrust:
        """The settings the launcher left for the middleware inside vLLM: the networks
        in ``STORMGUARD_TRUST_PRIORITY_FROM`` (loopback when unset), the token in
        ``STORMGUARD_PRIORITY_TOKEN``."""
        text = environ.get(TRUST_PRIORITY_ENV)
        token = environ.get(PRIORITY_TOKEN_ENV) or None
        try:
            networks = LOOPBACK_NETWORKS if text is None else split_networks(text)
        except ValueError as exc:
            raise ValueError(f"{TRUST_PRIORITY_ENV}: {exc}") from None
        try:
            return cls(networks, token)
        except ValueError as exc:  # its message never quotes the token
            raise ValueError(f"{PRIORITY_TOKEN_ENV}: {exc}") from None

    def trusts_address(self, host: str | None) -> bool:
        """Whether ``host`` (an address) is in a trusted network."""
        if not host or not self.networks:
            return False
        try:
            address = ipaddress.ip_address(host)
        except ValueError:  # a unix socket's name, or nothing usable
            return False
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            address = address.ipv4_mapped  # a dual-stack socket's view of an IPv4 peer
        return any(address in network for network in self.networks)

    def gate(self, scope: Scope, on_ignored: Callable[[], None] | None = None) -> Scope:
        """``scope`` as the app should see it: without ``x-priority-token``, and without
        a raised ``x-priority`` its caller may not make (``on_ignored`` is told)."""
        headers: list[tuple[bytes, bytes]] = scope.get("headers", [])
        raised = token = False
        for name, value in headers:
            if name == _PRIORITY and value.strip().lower() in _RAISED:
                raised = True
            elif name == _TOKEN:
                token = True
        if not (raised or token):
            return scope  # nearly every request: nothing to check, nothing copied
        drop = {_TOKEN}
        if raised and not self._trusted(scope, headers):
            drop.add(_PRIORITY)
            self._ignored(scope)
            if on_ignored is not None:
                on_ignored()
        kept = [(n, v) for n, v in headers if n not in drop]
        return {**scope, "headers": kept}

    def _trusted(self, scope: Scope, headers: list[tuple[bytes, bytes]]) -> bool:
        client = scope.get("client")
        if self.trusts_address(client[0] if client else None):
            return True
        if self._token is None:
            return False
        presented = [v.strip() for n, v in headers if n == _TOKEN]
        return len(presented) == 1 and hmac.compare_digest(presented[0], self._token)

    def _ignored(self, scope: Scope) -> None:
        """A warning the first time (a misconfigured trust shows at once), then debug."""
        client = scope.get("client")
        level = logging.DEBUG if self._warned else logging.WARNING
        self._warned = True
        logger.log(
            level,
            "x-priority above standard from %s treated as standard: not a trusted network "
            "(--trust-priority-from) and no valid x-priority-token",
            client[0] if client else "an unknown address",
            extra={"event": "priority_claim_ignored"},
        )


class PriorityGate:
    """ASGI middleware: every request passes :meth:`PriorityTrust.gate` before the app."""

    def __init__(
        self, app: ASGIApp, trust: PriorityTrust, on_ignored: Callable[[], None] | None = None
    ) -> None:
        self.app = app
        self.trust = trust
        self.on_ignored = on_ignored

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            scope = self.trust.gate(scope, self.on_ignored)
        await self.app(scope, receive, send)
