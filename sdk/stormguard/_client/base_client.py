"""What ``Client`` and ``AsyncClient`` share above their I/O (``BaseClient``):
construction, ``with_options``, introspection (``stats()``, the settings as
properties), and the checks of their HTTP client options.

Shaped like httpx's ``BaseClient``: ``Client`` and ``AsyncClient`` each hold a
``ClientCore`` (one class for both) and repeat only a thin chain of same-named
I/O methods. The core is
a stack, one job per module, each building on the one before: the options it is
given (``_call/arguments.py``), its calls' settings (``_call/settings.py``), the
call specs (``_call/spec_builder.py``) and the state its calls share
(``_call/client_core.py``). Their names are imported from where each is defined.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Literal

from .._call.arguments import ClientChanges, ClientOptions
from .._call.client_core import ClientCore
from .._call.stats import CallStats
from .._core.compat import Self, Unpack
from .._core.http import http_client_types, httpx, primary_limits
from .._policies.limiter.limiter import ConcurrencyLimiter
from .._policies.retry.budget import RetryBudget

__all__ = ["DEFAULT_CONNECTION_LIMITS", "BaseClient"]


#: The pool of a client's own httpx client, sized for LLM fan-out as openai-python's is:
#: a thousand calls at once, a hundred idle connections kept.
DEFAULT_CONNECTION_LIMITS = httpx.Limits(max_connections=1000, max_keepalive_connections=100)


def check_http_options(
    http_client: object, kind: Literal["Client", "AsyncClient"], connection_limits: object
) -> httpx.Limits | None:
    """A clear error for an ``http_client`` of the wrong kind (not an httpx or httpx2
    ``kind``), or one given with ``connection_limits`` (which size only the client's
    own pool); the limits as the primary library's."""
    if http_client is not None and not isinstance(http_client, http_client_types(kind)):
        raise TypeError(
            f"http_client must be an httpx.{kind} or an httpx2.{kind},"
            f" got {type(http_client).__name__}"
        )
    if http_client is not None and connection_limits is not None:
        raise TypeError(
            "connection_limits sizes the client's own pool: with your own http_client,"
            " set limits on it instead"
        )
    return None if connection_limits is None else primary_limits(connection_limits)


class BaseClient:
    """Construction and introspection shared by ``Client`` and ``AsyncClient``."""

    _owns_http: bool
    #: Set by ``close()``: this client's calls then fail at once (``ClientClosedError``).
    _closed = False

    def __init__(self, **options: Unpack[ClientOptions]) -> None:
        self._core = ClientCore(**options)

    def _bind_resources(self) -> None:
        """Create ``chat``, ``completions``, ``models`` ... bound to this client."""
        raise NotImplementedError

    def with_options(self, **changes: Unpack[ClientChanges]) -> Self:
        """A client with some settings changed (``ClientChanges``) that shares this
        one's connection pool and resilience state: retry budget, concurrency
        limiter, breakers, ejection, discovery and stats, as openai-python's
        ``client.with_options(timeout=...)`` shares its pool. Closing it leaves the
        pool open: close the client it came from. ``default_headers`` and
        ``default_query`` add to the current ones."""
        derived = copy.copy(self)
        derived._core = self._core.derive(changes)
        derived._owns_http = False
        derived._bind_resources()
        return derived

    #: openai-python's name for ``with_options``.
    copy = with_options

    @property
    def api_key(self) -> str | None:
        return self._core.api_key

    @property
    def organization(self) -> str | None:
        return self._core.organization

    @property
    def project(self) -> str | None:
        return self._core.project

    @property
    def timeout(self) -> float | None:
        """The total time of one call (None: no limit)."""
        return self._core.timeout

    @property
    def max_retries(self) -> int:
        """Retries after the first attempt (``retry_policy.max_attempts - 1``)."""
        return self._core.retry_policy.max_attempts - 1

    @property
    def default_query(self) -> Mapping[str, object]:
        return self._core.default_query

    @property
    def base_url(self) -> str:
        return self._core.base_url

    @property
    def retry_budget(self) -> RetryBudget:
        """The budget this client spends its retries from."""
        return self._core.budget

    @property
    def concurrency(self) -> ConcurrencyLimiter | None:
        """The adaptive concurrency limiter this client waits in (None: turned off)."""
        return self._core.limiter

    def stats(self) -> CallStats:
        """Logical calls, attempts, retries, failovers, requeues, paced 429s, budget
        refusals, fallbacks, retry amplification, every breaker's state, every
        endpoint's limit and ejection status, what DNS discovery found, the
        quota of each key paced, and what each deployment served."""
        core = self._core
        breakers, limiter, ejection = core.breakers, core.limiter, core.ejection
        return core.stats.snapshot(
            breakers=tuple(breakers.snapshot().values()) if breakers is not None else (),
            concurrency=limiter.state() if limiter is not None else (),
            endpoints=ejection.snapshot() if ejection is not None else (),
            endpoint_names=tuple(state.name for state in core.picker.states),
            discovery=core.discovery.snapshot() if core.discovery is not None else (),
            quota=core.quota.snapshot() if core.quota is not None else (),
            deployments=core.tier_watch.snapshot(),
            tiers_left=tuple(core.tier_watch.left().items()),
        )

    def __repr__(self) -> str:
        # Never the API key, nor a password in the URL (http://user:KEY@host).
        url = httpx.URL(self._core.base_url)
        shown = str(url.copy_with(userinfo=b"redacted")) if url.userinfo else str(url)
        return f"{type(self).__name__}(base_url={shown!r}, model={self._core.model!r})"
