"""The HTTP clients whose transport runs the whole pipeline: ``httpx_client()`` and
``async_httpx_client()`` (``stormguard.OpenAI`` builds its own with
``http_client_over``), of the library the installed openai-python runs on: an
``httpx2.Client`` from openai 3.x on (its own, typed and taken natively), an
``httpx.Client`` before; ``library="httpx"`` or ``"httpx2"`` asks by name.

They sit above the transports of both libraries (``_transport/transport.py`` and
``_transport/httpx2.py``, which subclasses them); the httpx2 ones are imported only
when an httpx2 client is asked for: httpx2 is not a dependency of stormguard.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Literal, overload

from .._call.arguments import ClientOptions
from .._client.async_client import AsyncClient
from .._client.client import Client
from .._core.compat import Unpack
from .._core.http import httpx
from .transport import AsyncStormguardTransport, StormguardTransport

if TYPE_CHECKING:
    import httpx2

__all__ = [
    "Library",
    "async_http_client_over",
    "async_httpx_client",
    "http_client_over",
    "httpx_client",
    "openai_http_library",
]


#: Which HTTP library's client :func:`httpx_client` returns: ``"openai"``, the one
#: the installed openai-python runs on (httpx2 from openai 3.x on, httpx before it);
#: or ``"httpx"``/``"httpx2"`` by name.
Library = Literal["openai", "httpx", "httpx2"]


def openai_http_library() -> str:
    """``"httpx2"`` when the installed openai-python is 3.x or later (it runs on
    httpx2), else ``"httpx"``; stormguard's own library when openai is not installed."""
    openai = sys.modules.get("openai")
    version = getattr(openai, "__version__", None)
    if not isinstance(version, str):
        import importlib.metadata  # slow to import; only needed when openai is not loaded

        try:
            version = importlib.metadata.version("openai")
        except importlib.metadata.PackageNotFoundError:
            return httpx.__name__
    major = version.split(".", 1)[0]
    return "httpx2" if major.isdigit() and int(major) >= 3 else "httpx"


def _library(library: Library) -> str:
    name = openai_http_library() if library == "openai" else library
    if name not in ("httpx", "httpx2"):
        raise ValueError(f"library must be 'openai', 'httpx' or 'httpx2', got {library!r}")
    if importlib.util.find_spec(name) is None:
        raise ImportError(
            f"stormguard.httpx_client(library={library!r}) needs {name}: pip install {name}"
        )
    return name


def _check_transport_options(options: Mapping[str, object]) -> None:
    """Options that mean nothing under openai-python, refused rather than ignored."""
    if options.get("openai_errors"):
        raise TypeError(
            "openai_errors applies to stormguard's Client: under httpx_client, openai-python"
            " raises its own errors for an error status, and gets the call's own error as"
            " openai's class for a failure with no response"
        )


@overload
def httpx_client(
    *, library: Literal["openai", "httpx2"] = ..., **options: Unpack[ClientOptions]
) -> httpx2.Client: ...
@overload
def httpx_client(
    *, library: Literal["httpx"], **options: Unpack[ClientOptions]
) -> httpx.Client: ...
def httpx_client(
    *, library: Library = "openai", **options: Unpack[ClientOptions]
) -> httpx.Client | httpx2.Client:
    """A client of the HTTP library openai-python runs on (``library="openai"``:
    httpx2 from openai 3.x on, httpx before it), whose transport runs the whole
    stormguard pipeline; give it to ``openai.OpenAI(http_client=...)``.
    ``library="httpx"`` or ``"httpx2"`` asks for one by name. Options as for
    ``Client``."""
    _check_transport_options(options)
    return http_client_over(Client(**options), library)


def http_client_over(client: Client, library: Library = "openai") -> httpx.Client | httpx2.Client:
    """A client of ``library`` (as :func:`httpx_client`) whose transport runs
    ``client``'s pipeline."""
    if _library(library) == "httpx2":
        from .httpx2 import httpx2_client

        return httpx2_client(client)
    # No timeout of its own: the pipeline gives every attempt its share of the
    # call's deadline.
    return httpx.Client(transport=StormguardTransport(client), timeout=None)


@overload
def async_httpx_client(
    *, library: Literal["openai", "httpx2"] = ..., **options: Unpack[ClientOptions]
) -> httpx2.AsyncClient: ...
@overload
def async_httpx_client(
    *, library: Literal["httpx"], **options: Unpack[ClientOptions]
) -> httpx.AsyncClient: ...
def async_httpx_client(
    *, library: Library = "openai", **options: Unpack[ClientOptions]
) -> httpx.AsyncClient | httpx2.AsyncClient:
    """The async twin of :func:`httpx_client`, for ``openai.AsyncOpenAI``."""
    _check_transport_options(options)
    return async_http_client_over(AsyncClient(**options), library)


def async_http_client_over(
    client: AsyncClient, library: Library = "openai"
) -> httpx.AsyncClient | httpx2.AsyncClient:
    """The async twin of :func:`http_client_over`."""
    if _library(library) == "httpx2":
        from .httpx2 import async_httpx2_client

        return async_httpx2_client(client)
    return httpx.AsyncClient(transport=AsyncStormguardTransport(client), timeout=None)
