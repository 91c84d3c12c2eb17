"""openai-python's own retry of a call that failed under the transport, answered
without a new call.

A call that ends with no response to hand on (a refused connection, a timeout, a
stream cut before its first event) is raised to openai-python as the call's error,
an ``OpenAIError`` (``answers.raised_for``). openai-python 2.x and 3.x hand
such an error on as it is; 1.x retries any exception of a send, up to its
``max_retries`` (2 by default), each retry a new request through the transport, which
would be a new logical call with its own retries: the retries multiply. openai marks
each retry in ``x-stainless-retry-count`` (1, 2, ...) and builds it from the same
options, so it is the same method, URL, headers and body but for that count. Such a
request, arriving while the failure it repeats is remembered, is answered with the
same failure, as an error of the caller's HTTP library (on its last retry, openai 1.x
turns a timeout into its ``APITimeoutError``), and nothing is sent.

Only failures raised to openai-python are remembered, for ``REMEMBER_S`` (openai
waits at most 8 s between two retries), at most ``MAX_REMEMBERED`` of them, the
oldest let go first; each is a digest and an error's class name and message, not the
error (its traceback holds the call).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from typing import NamedTuple

from .._core.clock import Clock
from .._core.fork import fork_safe_lock
from .._core.http import httpx, library_of
from ..protocol import HEADER_STAINLESS_RETRY_COUNT, parse_non_negative_int

__all__ = ["MAX_REMEMBERED", "REMEMBER_S", "FailedCalls"]

#: How long a failure raised to openai-python is remembered for its retries.
REMEMBER_S = 60.0
#: At most this many failures are remembered (the oldest go first).
MAX_REMEMBERED = 256

#: Headers that differ between openai-python's retries of one request.
_PER_ATTEMPT = frozenset({HEADER_STAINLESS_RETRY_COUNT, "content-length"})


class _Failure(NamedTuple):
    kind: str
    message: str
    until: float


def _digest(request: httpx.Request) -> bytes:
    """The request but for openai's retry count: method, URL, headers, body."""
    hasher = hashlib.blake2b(digest_size=16)
    hasher.update(f"{request.method} {request.url}\n".encode())
    for name, value in sorted(request.headers.multi_items()):
        if name.lower() not in _PER_ATTEMPT:
            hasher.update(f"{name.lower()}:{value}\n".encode())
    hasher.update(request.read())
    return hasher.digest()


def is_retry(request: httpx.Request) -> bool:
    """Whether ``request`` is openai-python's retry of an earlier one."""
    count = parse_non_negative_int(request.headers.get(HEADER_STAINLESS_RETRY_COUNT))
    return count is not None and count > 0


class FailedCalls:
    """The failures a transport raised to openai-python, by request (module doc)."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._lock = fork_safe_lock()  # the transport outlives a fork
        self._failures: OrderedDict[bytes, _Failure] = OrderedDict()

    def remember(self, request: httpx.Request, raised: httpx.HTTPError) -> None:
        """``request`` failed with ``raised`` (the error of its library that stands for
        the call's failure): its retries get the same."""
        failure = _Failure(type(raised).__name__, str(raised), self._clock.now() + REMEMBER_S)
        key = _digest(request)
        with self._lock:
            self._failures.pop(key, None)
            self._failures[key] = failure
            while len(self._failures) > MAX_REMEMBERED:
                self._failures.popitem(last=False)

    def answer(self, request: httpx.Request) -> httpx.HTTPError | None:
        """The error to raise for openai-python's retry ``request`` of a call that failed
        here a moment ago, or None (not a retry, or no such failure remembered)."""
        if not is_retry(request):
            return None
        key = _digest(request)
        now = self._clock.now()
        with self._lock:
            while self._failures:  # the oldest first: they expire in that order
                oldest = next(iter(self._failures.values()))
                if oldest.until > now:
                    break
                self._failures.popitem(last=False)
            failure = self._failures.get(key)
        if failure is None:
            return None
        lib = library_of(request)
        kind = getattr(lib, failure.kind, None)
        if not (isinstance(kind, type) and issubclass(kind, lib.RequestError)):
            kind = lib.TransportError
        error: httpx.HTTPError = kind(failure.message, request=request)
        return error
