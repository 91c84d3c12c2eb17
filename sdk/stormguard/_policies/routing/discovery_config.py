"""DNS discovery's settings, and the resolver and executor it uses by default.

``_policies/routing/discovery.py``'s docstring says why each default is what it is.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

__all__ = ["DiscoveryConfig", "Executor", "Resolver", "getaddrinfo_resolver", "run_in_thread"]

#: ``(host, port) -> addresses``: how a name is resolved (run in a thread of its own).
Resolver = Callable[[str, int], Sequence[str]]
#: Runs a look off the call path: a daemon thread of its own by default.
Executor = Callable[[Callable[[], None]], None]


def getaddrinfo_resolver(host: str, port: int) -> list[str]:
    """Every address of ``host`` (A and AAAA records, or the hosts file), in the
    system's order, each once."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def run_in_thread(job: Callable[[], None]) -> None:
    """Run a look in a daemon thread of its own (the default ``executor``)."""
    threading.Thread(target=job, name="stormguard-dns", daemon=True).start()


def _positive(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class DiscoveryConfig:
    """How DNS discovery looks names up (``discovery.py``'s docstring says why each
    default).

    >>> DiscoveryConfig(refresh_interval=10.0).min_refresh_interval
    5.0
    >>> fixed = DiscoveryConfig(resolver=lambda host, port: ["10.0.0.5", "10.0.0.6"])
    """

    #: Seconds between looks while calls come (a look happens at the first call after).
    refresh_interval: float = 30.0
    #: The least time between two looks, when a failure asks for one sooner.
    min_refresh_interval: float = 5.0
    #: A look that has not answered by then no longer holds the next one back.
    resolve_timeout: float = 10.0
    #: Addresses past this many (in the resolver's order) are left out.
    max_addresses: int = 256
    #: ``(host, port) -> addresses``; ``socket.getaddrinfo`` by default.
    resolver: Resolver | None = None
    #: Runs a look: a daemon thread of its own by default; a test may run it inline
    #: (``executor=lambda look: look()``).
    executor: Executor | None = None

    def __post_init__(self) -> None:
        _positive("refresh_interval", self.refresh_interval)
        _positive("min_refresh_interval", self.min_refresh_interval)
        _positive("resolve_timeout", self.resolve_timeout)
        if self.min_refresh_interval > self.refresh_interval:
            raise ValueError("min_refresh_interval must not exceed refresh_interval")
        count = self.max_addresses
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ValueError(f"max_addresses must be an integer >= 1, got {count!r}")
