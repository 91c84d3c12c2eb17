"""A base URL as the client keeps it: no trailing slash, named ``host:port``, and
the ``dns+`` prefix that asks for DNS discovery (``_policies/routing/discovery.py``)."""

from __future__ import annotations

from ..._core.http import httpx
from ..._core.redact import display_url

__all__ = ["DNS_SCHEME_PREFIX", "normalize_base_url", "split_dns_scheme"]

#: A base URL to follow in DNS (``dns+http://name:port/v1``): ``_policies/routing/discovery.py``.
DNS_SCHEME_PREFIX = "dns+"


def split_dns_scheme(url: str) -> tuple[str, bool]:
    """``(url without "dns+", whether it had it)``. Here, not in ``discovery.py``, so
    that a client with no DNS name never loads discovery."""
    if url[: len(DNS_SCHEME_PREFIX)].lower() == DNS_SCHEME_PREFIX:
        return url[len(DNS_SCHEME_PREFIX) :], True
    return url, False


def normalize_base_url(base_url: str | httpx.URL) -> tuple[str, str]:
    """``(base_url without trailing slash, "host:port")``; ValueError for a non-HTTP URL."""
    url = httpx.URL(str(base_url))
    if url.scheme not in ("http", "https") or not url.host:
        raise ValueError(f"base_url must be an http(s) URL, got {display_url(url)[:200]!r}")
    port = url.port or (443 if url.scheme == "https" else 80)
    return str(url).rstrip("/"), f"{url.host}:{port}"
