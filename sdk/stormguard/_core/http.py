"""The HTTP library under the client: httpx, or its successor httpx2.

openai-python 3.x runs on httpx2, a continuation of httpx under a new name with
the same API; code written for openai 1.x runs on httpx. stormguard speaks the
API the two share. It imports httpx when it is installed (the library it was
built and tested on) and httpx2 otherwise, so it runs with either one alone.
Every other module takes ``httpx`` (and ``httpcore``) from here, never by name.

Objects of the other library, when both are installed, are still understood: a
``Client(http_client=httpx2.Client())`` beside an imported httpx, or openai 3.x
sending its httpx2 requests through ``stormguard.httpx2_client()``. Their
exceptions and responses are recognised by the functions below, which look at
every HTTP library loaded in the process (a library nobody imported has no
objects about), as openai-python's own ``openai._httpx2`` module does for httpx.
What stormguard builds for such an object (a response, a stream, an error) is
built from the object's own library: :func:`library_of`.

``httpcore`` (``httpcore2`` under httpx2) is an attribute loaded on first use:
only the network backends of the client's own pools (``_io/deadline_backend.py``,
sync and async) need it, once a pool is built, and httpx itself imports it no
sooner.
"""

from __future__ import annotations

import importlib
import sys
from types import ModuleType
from typing import TYPE_CHECKING, Any, TypeVar, cast, overload

if TYPE_CHECKING:  # checked against httpx; httpx2 has the same API
    from typing import TypeAlias

    import httpcore
    import httpx
    import httpx2

    #: An ``http_client`` a sync client accepts: httpx's or httpx2's.
    SyncHTTPClient: TypeAlias = "httpx.Client | httpx2.Client"
    #: An ``http_client`` an async client accepts: httpx's or httpx2's.
    AsyncHTTPClient: TypeAlias = "httpx.AsyncClient | httpx2.AsyncClient"
    #: Connection limits: httpx's or httpx2's ``Limits``.
    LimitsLike: TypeAlias = "httpx.Limits | httpx2.Limits"
else:
    try:
        import httpx
    except ImportError:
        import httpx2 as httpx

__all__ = [
    "decoding_errors",
    "http_client_types",
    "http_errors",
    "httpcore",
    "httpx",
    "library_of",
    "loaded_libraries",
    "primary_limits",
    "request_errors",
    "response_types",
    "timeout_errors",
    "transport_errors",
]

_NAMES = ("httpx", "httpx2")
E = TypeVar("E", bound=BaseException)


def __getattr__(name: str) -> Any:
    """``httpcore``: the primary library's (httpcore for httpx, httpcore2 for httpx2),
    imported on first use."""
    if name == "httpcore":
        module = importlib.import_module("httpcore" if httpx.__name__ == "httpx" else "httpcore2")
        globals()["httpcore"] = module
        return module
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def loaded_libraries() -> tuple[ModuleType, ...]:
    """httpx and httpx2, those of them imported in this process (the primary one
    always is)."""
    found = [httpx]
    for name in _NAMES:
        module = sys.modules.get(name)
        if module is not None and module not in found and hasattr(module, "HTTPError"):
            found.append(module)
    return tuple(found)


def library_of(obj: object) -> Any:
    """The library (httpx or httpx2 module) whose class ``obj`` is an instance of;
    the primary one for anything else."""
    root = type(obj).__module__.split(".", 1)[0]
    if root in _NAMES:
        module = sys.modules.get(root)
        if module is not None:
            return module
    return httpx


def _each(name: str, also: tuple[type[BaseException], ...] = ()) -> Any:
    return (*(getattr(module, name) for module in loaded_libraries()), *also)


@overload
def http_errors() -> tuple[type[httpx.HTTPError], ...]: ...
@overload
def http_errors(*also: type[E]) -> tuple[type[httpx.HTTPError] | type[E], ...]: ...
def http_errors(*also: type[BaseException]) -> Any:
    """Every loaded library's ``HTTPError`` (and ``also``), for an ``except`` clause."""
    return _each("HTTPError", also)


def request_errors() -> tuple[type[httpx.RequestError], ...]:
    return cast("tuple[type[httpx.RequestError], ...]", _each("RequestError"))


def transport_errors() -> tuple[type[httpx.TransportError], ...]:
    return cast("tuple[type[httpx.TransportError], ...]", _each("TransportError"))


@overload
def timeout_errors() -> tuple[type[httpx.TimeoutException], ...]: ...
@overload
def timeout_errors(*also: type[E]) -> tuple[type[httpx.TimeoutException] | type[E], ...]: ...
def timeout_errors(*also: type[BaseException]) -> Any:
    return _each("TimeoutException", also)


def decoding_errors() -> tuple[type[httpx.DecodingError], ...]:
    return cast("tuple[type[httpx.DecodingError], ...]", _each("DecodingError"))


def http_client_types(kind: str) -> tuple[type, ...]:
    """Every loaded library's ``Client`` (``kind="Client"``) or ``AsyncClient``."""
    return tuple(getattr(module, kind) for module in loaded_libraries())


def primary_limits(limits: object) -> httpx.Limits:
    """``limits`` as the primary library's ``Limits`` (httpx2's has the same fields)."""
    if isinstance(limits, httpx.Limits):
        return limits
    if not isinstance(limits, _each("Limits")):
        raise TypeError(f"connection_limits must be an httpx.Limits, got {type(limits).__name__}")
    return httpx.Limits(
        max_connections=getattr(limits, "max_connections", None),
        max_keepalive_connections=getattr(limits, "max_keepalive_connections", None),
        keepalive_expiry=getattr(limits, "keepalive_expiry", None),
    )


def response_types() -> tuple[type[httpx.Response], ...]:
    """Every loaded library's ``Response``, for ``isinstance``."""
    return cast("tuple[type[httpx.Response], ...]", _each("Response"))
