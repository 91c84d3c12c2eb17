"""How many requests the server serves at once, and how many body bytes they hold.

Outside every middleware but the request id and the response count (so its refusals
are named and counted as every answer is): a request enters when its headers are
complete, before any of its body is read, and holds a place and its body's bytes
(``Content-Length``, capped at the body-size limit; the whole limit for a chunked
body, whose size is unknown) until its answer is sent or its client has gone.
Past either limit it gets an OpenAI-shaped 503 with a Retry-After (and the load
headers, with ``x-load-shed: queue_full``, when admission is on), then the
connection closes, so a refused client frees its connection at once.

With admission on, its queue refuses in steady overload long before this
limit is reached (it holds 256 by default); this is the backstop for a burst of
more requests at once than that, for ``--admission off``, and for requests
admission never sees (a body that is still arriving, ``/metrics``). It ignores
``x-priority``. Retry-After comes from the measured rate at which requests (or
body bytes) are given back.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge
from starlette.types import ASGIApp, Receive, Scope, Send

from stormguard.protocol import ShedReason, format_retry_after
from stormguard_server.admission.drain_meter import DrainMeter
from stormguard_server.clock import ClockLike, as_clock
from stormguard_server.config import ServerConfig
from stormguard_server.http.errors import error_response
from stormguard_server.http.middleware import declared_content_length
from stormguard_server.http.refusals import refusal_headers

__all__ = ["RequestLimits", "RequestLimitsConfig"]

logger = logging.getLogger("stormguard_server.request_limits")

# Retry-After before anything has been given back (admission says the same).
_UNMEASURED_RETRY_AFTER_S = 1.0


@dataclass(frozen=True, slots=True)
class RequestLimitsConfig:
    max_requests: int
    max_body_bytes_held: int
    # The largest body one request may have (a larger one gets 413).
    max_body_bytes: int
    min_retry_after_s: float = 0.05
    max_retry_after_s: float = 30.0
    rate_period_s: float = 5.0

    @classmethod
    def for_server(cls, config: ServerConfig) -> RequestLimitsConfig:
        """The limits ``config`` sets (Retry-After clamped as admission clamps it)."""
        return cls(
            max_requests=config.max_concurrent_requests,
            max_body_bytes_held=config.max_buffered_body_bytes,
            max_body_bytes=config.max_body_bytes,
            min_retry_after_s=config.admission.min_retry_after_s,
            max_retry_after_s=config.admission.max_retry_after_s,
            rate_period_s=config.admission.drain_period_s,
        )

    def __post_init__(self) -> None:
        if self.max_requests < 1:
            raise ValueError("max_requests must be at least 1")
        if self.max_body_bytes_held < self.max_body_bytes:
            raise ValueError(
                f"max_body_bytes_held ({self.max_body_bytes_held}) must be at least "
                f"max_body_bytes ({self.max_body_bytes}), or the largest body never fits"
            )


class _Pool:
    """Units (requests, bytes) held against a capacity, and how fast they come back."""

    def __init__(self, capacity: int, meter: DrainMeter) -> None:
        self.capacity = capacity
        self.held = 0
        self._meter = meter

    def fits(self, amount: int) -> bool:
        return self.held + amount <= self.capacity

    def take(self, amount: int) -> None:
        self.held += amount
        self._meter.start()  # a release's rate counts the time since the first take

    def give_back(self, amount: int) -> None:
        self.held -= amount
        self._meter.record(amount)

    def wait_s(self, amount: int) -> float | None:
        """Seconds until ``amount`` fits at the measured give-back rate; None unmeasured."""
        rate = self._meter.rate()
        if rate is None or rate <= 0:
            return None
        return max(0, self.held + amount - self.capacity) / rate


class RequestLimits:
    """Refuses a request past the in-flight or the body-bytes limit (see module doc)."""

    def __init__(
        self,
        app: ASGIApp,
        config: RequestLimitsConfig,
        *,
        load_headers: Callable[[], dict[str, str]] = dict,
        shed_headers: bool = True,
        registry: CollectorRegistry | None = None,
        clock: ClockLike | None = None,
    ) -> None:
        self.app = app
        clock = as_clock(clock)
        self.config = config
        self._load_headers = load_headers
        self._shed_headers = shed_headers
        self.requests = _Pool(config.max_requests, DrainMeter(config.rate_period_s, clock))
        self.body_bytes = _Pool(config.max_body_bytes_held, DrainMeter(config.rate_period_s, clock))
        self._refused: Counter | None = None
        if registry is not None:
            self._register(registry)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        body = self._body_bytes(scope)
        if not self.requests.fits(1):
            message = f"the server is serving its limit of {self.config.max_requests} requests"
            await self._refuse("requests", self.requests.wait_s(1), message, scope, receive, send)
            return
        if not self.body_bytes.fits(body):
            message = (
                f"the server holds its limit of {self.config.max_body_bytes_held} bytes "
                "of request bodies"
            )
            wait_s = self.body_bytes.wait_s(body)
            await self._refuse("body_bytes", wait_s, message, scope, receive, send)
            return
        self.requests.take(1)
        self.body_bytes.take(body)
        try:
            await self.app(scope, receive, send)
        finally:
            self.requests.give_back(1)
            self.body_bytes.give_back(body)

    def _body_bytes(self, scope: Scope) -> int:
        """Bytes this request's body may hold: its Content-Length, capped at the limit;
        the whole limit when that is unknown (a chunked body, or a length that is not
        a number: h11 refuses those, another server may not); 0 without a body."""
        declared = declared_content_length(scope)
        if declared is not None:
            return min(declared, self.config.max_body_bytes)
        framing = (b"content-length", b"transfer-encoding")
        framed = any(name.lower() in framing for name, _ in scope.get("headers", []))
        return self.config.max_body_bytes if framed else 0

    async def _refuse(
        self,
        limit: str,
        wait_s: float | None,
        message: str,
        scope: Scope,
        receive: Receive,
        send: Send,
    ) -> None:
        retry_after = _UNMEASURED_RETRY_AFTER_S if wait_s is None else wait_s
        retry_after = min(
            max(retry_after, self.config.min_retry_after_s), self.config.max_retry_after_s
        )
        logger.debug("request refused: %s", message)
        if self._refused is not None:
            self._refused.labels(limit).inc()
        if self._shed_headers:
            headers = {
                **self._load_headers(),
                **refusal_headers(ShedReason.QUEUE_FULL, retry_after, True),
            }
        else:
            headers = format_retry_after(retry_after)
        headers["connection"] = "close"
        response = error_response(
            503, f"{message}; try again later", code="queue_full", headers=headers
        )
        await response(scope, receive, send)

    def _register(self, registry: CollectorRegistry) -> None:
        """What is held now, and the refusals, in the app's /metrics."""
        Gauge(
            "stormguard_http_requests_in_flight",
            "Requests being served (complete headers to the end of the answer).",
            registry=registry,
        ).set_function(lambda: self.requests.held)
        Gauge(
            "stormguard_http_body_bytes_held",
            "Request-body bytes held by the requests being served.",
            registry=registry,
        ).set_function(lambda: self.body_bytes.held)
        self._refused = Counter(
            "stormguard_http_refused",
            "Requests refused before the app: over the in-flight or body-bytes limit.",
            ["limit"],
            registry=registry,
        )
