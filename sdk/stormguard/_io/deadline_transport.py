"""The sync transport that holds every socket operation to the call's deadline.

httpx's timeouts bound each socket operation, not a whole request: a server that
drips its headers a byte a second satisfies a 2 s read timeout forever. The
async client bounds an attempt's send and its reads by the time left
(``read_within.py``); a blocked sync ``recv`` cannot be cancelled. So the sync
client's connections are made by a network backend (httpcore's public
``NetworkBackend`` seam) whose streams clip the timeout of every ``connect``,
``read`` and ``write`` to the time left before the current call's deadline
(``Deadline.bound()``, a context variable). A dripping server's reads each
succeed, until the one that would cross the deadline times out *at* the
deadline. No timer: the bound costs a clock read per socket operation. The
one blocking step that takes no timeout, resolving a host name, runs in a
thread of its own that the connect waits for until the deadline (for a new
connection to a name, not an IP address; pooled connections skip it).

A connection serves one request at a time (HTTP/1.1), so its stream takes the
deadline of the request whose head it writes and keeps it for the reads that
follow: a ``Stream`` read in the caller's loop, after the driver returned, is
held to its call's deadline too. A request sent without a current deadline (a
``DeadlineTransport`` in your own client, used for anything else) is not
clipped at all.

The clipping backend and its streams live in ``deadline_backend.py``, loaded when
the first transport is built: they subclass httpcore's classes, and httpcore is
not needed before a connection pool is.
"""

from __future__ import annotations

from typing import Any

from .._core.http import httpx, library_of

__all__ = ["DeadlineTransport", "hold_to_deadlines"]


class DeadlineTransport(httpx.HTTPTransport):
    """``httpx.HTTPTransport`` (same options: TLS, proxy, limits, uds, retries; HTTP/1.1
    only) whose connections are held to the current call's deadline (module doc).

    Give it to your own client to keep that bound with ``Client(http_client=...)``::

        http = httpx.Client(transport=stormguard.DeadlineTransport(verify=ctx, proxy=url))

    A subclass rather than a transport written over httpcore's public API: httpx
    builds the pool exactly as for any other client (each proxy kind, TLS, limits)
    and maps httpcore's errors to its own, and this class only wraps the pool's
    network backend (httpx's ``_pool`` and httpcore's ``_network_backend``, the one
    seam httpx does not expose). A transport of our own would copy some 80 lines
    of httpx that then drift from it. The hook is checked here, at construction,
    and the hostile-server tests fail if it ever stops bounding a request.
    """

    def __init__(self, **options: Any) -> None:
        if options.get("http2"):
            # HTTP/2 multiplexes requests on one connection: one deadline per
            # connection would cut the reads of every request on it.
            raise ValueError("stormguard.DeadlineTransport serves HTTP/1.1 only (http2=False)")
        super().__init__(**options)
        from .deadline_backend import hold_transport

        if not hold_transport(self):  # pragma: no cover (httpcore 1.x has the seam)
            raise RuntimeError(
                "stormguard.DeadlineTransport found no network backend in this httpcore"
                " version; it needs httpcore 1.x or httpcore2"
            )


def hold_to_deadlines(client: object) -> None:
    """Hold your own ``client`` (an ``httpx.Client`` or ``httpx2.Client``) to
    stormguard's call deadlines, as the default one is: each of its
    ``HTTPTransport`` s (the default one and any mounted, HTTP/1.1) gets the
    clipping network backend. Requests you send with the client yourself carry no
    deadline and are not clipped; other transports are left as they are."""
    transports = [getattr(client, "_transport", None), *getattr(client, "_mounts", {}).values()]
    for transport in transports:
        if transport is not None and isinstance(transport, library_of(transport).HTTPTransport):
            from .deadline_backend import hold_transport

            hold_transport(transport)
