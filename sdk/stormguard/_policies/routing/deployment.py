"""Several providers behind one client: ``Deployment``, an ``Endpoint`` with a
provider's own settings (its credential, its name for each model the client's
calls ask for, its default query, its tier), and ``Pin``, a call held to one tier
or one deployment.

A call asks for a logical model ("chat-large"); the attempt that goes to a
deployment sends that deployment's name for it (``gpt-4.1`` at OpenAI, the
deployment ``prod-gpt41`` at Azure OpenAI), its credential and its query, and
nothing of another provider's: the client's own ``api_key``, its
``OpenAI-Organization`` and a call's own credential headers (openai-python's
``Authorization`` in transport mode) never go to a deployment. LiteLLM's
Router shapes its ``model_list`` the same way: a ``model_name`` the caller
uses, and ``litellm_params`` (``model``, ``api_key``, ``api_base``,
``api_version``) per deployment; ``tier`` is its ``order``.

Checked when made, with a clear ``ValueError``: a tier below 1, a model mapped to
nothing, a key both given and named by an environment variable, a key header
given twice. Two deployments with one name are refused when the client is made
(``_policies/routing/picker.py``), a key named by an unset environment variable too
(``resolved``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Protocol
from urllib.parse import parse_qsl, urlencode, urlsplit

from ..._core.redact import display_url, is_credential_name
from .endpoint_config import Endpoint

__all__ = [
    "PIN_DEPLOYMENT_HEADER",
    "PIN_TIER_HEADER",
    "Deployment",
    "FrozenMap",
    "Pin",
    "is_account_header",
    "pin_from_headers",
    "with_query",
]

#: Headers that pin a call (openai-python's ``extra_headers`` in transport mode);
#: read by the client and never sent.
PIN_TIER_HEADER = "x-stormguard-tier"
PIN_DEPLOYMENT_HEADER = "x-stormguard-deployment"

#: Headers that name an account at one provider, besides the credentials: never
#: sent to another provider.
_ACCOUNT_HEADERS = frozenset({"openai-organization", "openai-project"})


def is_account_header(name: str) -> bool:
    """Whether a header carries a provider's credential or names an account there
    (``authorization``, ``api-key``, any ``*-key``/``*-token``/``*-secret``,
    ``OpenAI-Organization``, ``OpenAI-Project``)."""
    return is_credential_name(name) or name.lower() in _ACCOUNT_HEADERS


class FrozenMap(Mapping[str, str]):
    """An immutable, hashable mapping of strings (a frozen ``Deployment`` holds its
    model names, headers and query in them, and stays hashable)."""

    __slots__ = ("_items",)

    def __init__(self, items: Mapping[str, str]) -> None:
        self._items = dict(items)

    def __getitem__(self, key: str) -> str:
        return self._items[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __hash__(self) -> int:
        return hash(frozenset(self._items.items()))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Mapping) and dict(self._items) == dict(other)

    def __repr__(self) -> str:
        return repr(self._items)


def _text(value: object, what: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{what} must be a non-empty string, got {str(value)[:50]!r}")
    if any(c in value for c in "\r\n\0"):
        raise ValueError(f"{what} must not contain a line break or NUL")
    return value


def _mapping(value: object, what: str) -> Mapping[Any, Any]:
    if not isinstance(value, Mapping):
        raise TypeError(f"{what} must be a mapping, got {type(value).__name__}")
    return value


@dataclass(frozen=True, kw_only=True, repr=False)
class Deployment(Endpoint):
    """One provider's deployment of the client's models: an ``Endpoint`` with its own
    credential, model names, default query and tier.

    ``models`` maps each logical model a call may ask for to the provider's name for
    it (a list serves them under the same names); ``tier`` 1 is the most preferred,
    and calls go to the best tier that can take them (docs/providers.md).
    ``api_key`` (or ``api_key_env``, the name of an environment variable read when
    the client is made) is sent as ``Authorization: Bearer <key>``, or as the bare
    value of ``api_key_header`` (Azure OpenAI's ``api-key``); ``headers`` are sent
    with every attempt to it, ``query`` added to every URL (Azure's
    ``api-version``).

    >>> d = Deployment(
    ...     "https://example.openai.azure.com/openai/v1",
    ...     name="azure",
    ...     tier=2,
    ...     models={"chat-large": "prod-gpt41"},
    ...     api_key="azure-key-0123456789",
    ...     api_key_header="api-key",
    ...     query={"api-version": "preview"},
    ... )
    >>> d.model_for("chat-large"), d.tier, "0123456789" in repr(d)
    ('prod-gpt41', 2, False)
    """

    tier: int = 1
    api_key: str | None = None
    api_key_env: str | None = None
    api_key_header: str = "authorization"
    headers: Mapping[str, str] | None = None
    query: Mapping[str, str] | None = None
    #: The provider's name of each logical model (filled from ``models``).
    model_names: FrozenMap = field(init=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        given = self.models
        names: dict[str, str] = {}
        if isinstance(given, Mapping):
            for logical, provided in given.items():
                _text(logical, "a logical model name")
                if not isinstance(provided, str) or not provided.strip():
                    raise ValueError(
                        f"model {logical!r} is mapped to nothing: give the provider's name"
                        " for it (or list it, to send it as it is)"
                    )
                names[logical] = _text(provided, f"the provider's name of {logical!r}")
            object.__setattr__(self, "models", list(given))
        super().__post_init__()
        if self.models is not None and not self.models:
            raise ValueError("models is empty: name the models it serves, or None for any")
        if names:
            object.__setattr__(self, "models", FrozenMap(names))
        object.__setattr__(self, "model_names", FrozenMap(names))
        tier = self.tier
        if isinstance(tier, bool) or not isinstance(tier, int) or tier < 1:
            raise ValueError(f"tier must be an integer >= 1 (1 is preferred), got {tier!r}")
        if self.api_key is not None and self.api_key_env is not None:
            raise ValueError(
                "give api_key or api_key_env (the name of an environment variable), not both"
            )
        if self.api_key is not None:
            _text(self.api_key, "api_key")
        if self.api_key_env is not None:
            _text(self.api_key_env, "api_key_env")
        header = _text(self.api_key_header, "api_key_header").lower()
        object.__setattr__(self, "api_key_header", header)
        headers = {
            _text(k, "a header name").lower(): _text(v, f"header {k!r}")
            for k, v in _mapping(self.headers or {}, "headers").items()
        }
        if header in headers and (self.api_key is not None or self.api_key_env is not None):
            raise ValueError(
                f"the key goes in {header!r} and headers gives {header!r} too: give one"
            )
        object.__setattr__(self, "headers", FrozenMap(headers))
        query = {
            _text(k, "a query parameter"): _text(str(v), f"query parameter {k!r}")
            for k, v in _mapping(self.query or {}, "query").items()
        }
        object.__setattr__(self, "query", FrozenMap(query))

    @property
    def host(self) -> str:
        """``host:port`` of its base URL, as written (the service its quota is of)."""
        return urlsplit(self.base_url).netloc.rpartition("@")[2]

    def model_for(self, model: str) -> str:
        """The provider's name of the logical ``model`` (itself when not mapped)."""
        return self.model_names.get(model, model)

    def resolved(self, environ: Mapping[str, str] | None = None) -> Deployment:
        """This deployment with ``api_key_env`` read (a clear error when it is unset),
        as the client reads it once, when it is made."""
        env = self.api_key_env
        if env is None:
            return self
        value = (os.environ if environ is None else environ).get(env)
        if not value:
            label = self.name or display_url(self.base_url)
            raise ValueError(
                f"deployment {label!r}: the environment variable {env} (api_key_env) is not set"
            )
        return replace(self, api_key=value, api_key_env=None)

    def sent_headers(self) -> dict[str, str]:
        """What every attempt to it carries: its credential and its headers."""
        sent = dict(self.headers or {})
        key = self.api_key
        if key is not None:
            header = self.api_key_header
            sent[header] = f"Bearer {key}" if header == "authorization" else key
        return sent

    def credential(self) -> str | None:
        """The credential it sends (for its quota's key): its key, else the value of
        the first credential header among its headers."""
        if self.api_key is not None:
            return self.api_key
        for name, value in (self.headers or {}).items():
            if is_credential_name(name):
                return value
        return None

    def __repr__(self) -> str:
        # Never the key: its header's name only, and the names of the headers.
        models = None if self.models is None else dict(self.model_names) or sorted(self.models)
        key = (
            f"{self.api_key_header}=<from ${self.api_key_env}>"
            if self.api_key_env is not None
            else (f"{self.api_key_header}=<set>" if self.api_key is not None else None)
        )
        return (
            f"Deployment(base_url={display_url(self.base_url)!r}, name={self.name!r},"
            f" tier={self.tier}, models={models!r}, key={key},"
            f" headers={sorted(self.headers or {})},"
            f" query={dict(self.query or {})!r}, weight={self.weight!r})"
        )


def with_query(url: str, query: Mapping[str, str] | None) -> str:
    """``url`` with each parameter of ``query`` its own query does not already have
    (a call's ``extra_query`` wins over a deployment's default)."""
    if not query:
        return url
    _, sep, existing = url.partition("?")
    present = {key for key, _ in parse_qsl(existing, keep_blank_values=True)} if sep else set()
    extra = urlencode([(k, v) for k, v in query.items() if k not in present])
    if not extra:
        return url
    return f"{url}{'&' if sep else '?'}{extra}"


class _Pinnable(Protocol):
    """What a ``Pin`` judges of an endpoint (``endpoint_state.EndpointState``, which
    imports this module): its tier and its name."""

    @property
    def tier(self) -> int: ...

    @property
    def name(self) -> str: ...


@dataclass(frozen=True, slots=True)
class Pin:
    """Hold one call to a tier, or to one deployment (by name): only endpoints it
    admits take its attempts, and none of another tier or deployment does, even when
    they cannot (the call then fails as a call whose endpoints are all out does).

    >>> Pin(tier=2).tier, Pin(deployment="azure").deployment
    (2, 'azure')
    """

    tier: int | None = None
    deployment: str | None = None

    def __post_init__(self) -> None:
        if (self.tier is None) == (self.deployment is None):
            raise ValueError("a Pin names a tier or a deployment: give exactly one")
        tier = self.tier
        if tier is not None and (isinstance(tier, bool) or not isinstance(tier, int) or tier < 1):
            raise ValueError(f"tier must be an integer >= 1, got {tier!r}")
        if self.deployment is not None:
            _text(self.deployment, "deployment")

    def describe(self) -> str:
        return f"tier {self.tier}" if self.tier is not None else f"deployment {self.deployment!r}"

    def admits(self, state: _Pinnable) -> bool:
        if self.tier is not None:
            return state.tier == self.tier
        return state.name == self.deployment


def pin_from_headers(headers: Mapping[str, str]) -> tuple[Pin | None, dict[str, str]]:
    """The ``Pin`` a call's headers ask for (``x-stormguard-tier: 2`` or
    ``x-stormguard-deployment: azure``; None: none), and the headers without them."""
    tier = deployment = None
    rest: dict[str, str] = {}
    for name, value in headers.items():
        lowered = name.lower()
        if lowered == PIN_TIER_HEADER:
            try:
                tier = int(value.strip())
            except (ValueError, AttributeError):
                raise ValueError(
                    f"{PIN_TIER_HEADER} must be a tier number, got {value!r}"
                ) from None
        elif lowered == PIN_DEPLOYMENT_HEADER:
            deployment = value.strip()
        else:
            rest[name] = value
    if tier is None and deployment is None:
        return None, rest
    return Pin(tier=tier, deployment=deployment), rest
