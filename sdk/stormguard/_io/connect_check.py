"""The connect check that brings an unreachable endpoint back: a TCP connect, no
request, in a thread of its own so that no call waits for it.

The decision of when to check and what the answer means is the tracker's
(``_policies/routing/ejection.py``); this module only opens the connection.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable

from .._core.http import httpx

__all__ = ["connect_check", "probe_address", "run_in_thread"]


def connect_check(host: str, port: int, timeout: float) -> bool:
    """Whether a TCP connection to ``host:port`` opens within ``timeout`` (then closed)."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def probe_address(base_url: str) -> tuple[str, int]:
    """The ``(host, port)`` a connect check of the endpoint at ``base_url`` opens."""
    url = httpx.URL(base_url)
    return url.host, url.port or (443 if url.scheme == "https" else 80)


def run_in_thread(work: Callable[[], None]) -> None:
    """Run a connect check in a daemon thread of its own (the tracker's default)."""
    threading.Thread(target=work, name="stormguard-connect-check", daemon=True).start()
