"""One DNS name the client follows: what its looks found, a change of its
endpoints as listeners see it, and a frozen copy for ``client.stats()``.

``NameState`` is live state, changed only under the ``Discovery``'s lock
(``_policies/routing/discovery.py``); ``DiscoveryChange`` and ``DiscoverySnapshot`` are frozen,
safe to hand to any thread.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..._core.http import httpx

if TYPE_CHECKING:
    from .discovery_wait import LookRound
    from .endpoint_config import Endpoint

__all__ = ["DiscoveryChange", "DiscoveryListener", "DiscoverySnapshot", "NameState"]


@dataclass(frozen=True, slots=True)
class DiscoveryChange:
    """The endpoints of a DNS name changed (given to ``discovery_listeners``)."""

    #: The name looked up, ``host:port``.
    name: str
    added: tuple[str, ...]
    removed: tuple[str, ...]
    #: Its endpoints now.
    endpoints: tuple[str, ...]


DiscoveryListener = Callable[[DiscoveryChange], None]


@dataclass(frozen=True, slots=True)
class DiscoverySnapshot:
    """A frozen copy of one DNS name's discovery, for ``client.stats().discovery``."""

    name: str
    #: Its endpoints now (the last good look).
    endpoints: tuple[str, ...]
    looks: int
    failures: int
    #: Why the last look failed (None: it did not).
    last_error: str | None
    #: Seconds since the last good look (None: none yet).
    resolved_ago: float | None


class NameState:
    """One DNS name and what the last looks found (under the discovery's lock)."""

    def __init__(self, template: Endpoint) -> None:
        url = httpx.URL(template.base_url)
        self.template = template
        self.scheme = url.scheme
        self.host = url.host
        self.port = url.port or (443 if url.scheme == "https" else 80)
        self.label = f"{_bracketed(self.host)}:{self.port}"
        #: The ``Host`` header: the service's own name, as the caller wrote it.
        self.authority = url.netloc.decode("ascii")
        self.url = url
        self.addresses: tuple[str, ...] | None = None
        self.started_at = -math.inf
        self.resolved_at = -math.inf
        self.generation = 0
        self.applied = 0
        self.in_flight = 0
        self.round: LookRound | None = None
        #: A failure asked for a look sooner than the period.
        self.wanted = False
        self.error: str | None = None
        self.looks = 0
        self.failures = 0

    def endpoint_name(self, address: str) -> str:
        own = f"{_bracketed(address)}:{self.port}"
        return own if self.template.name is None else f"{self.template.name}/{own}"

    def snapshot(self, now: float) -> DiscoverySnapshot:
        """A frozen copy, ``now`` on the discovery's clock (under its lock)."""
        return DiscoverySnapshot(
            name=self.label,
            endpoints=tuple(self.endpoint_name(a) for a in self.addresses or ()),
            looks=self.looks,
            failures=self.failures,
            last_error=self.error,
            resolved_ago=now - self.resolved_at if math.isfinite(self.resolved_at) else None,
        )


def _bracketed(host: str) -> str:
    return f"[{host}]" if ":" in host else host
