"""``stormguard.OpenAI`` and ``stormguard.AsyncOpenAI`` where openai-python is installed:
openai's own clients, over stormguard's pipeline.

Frameworks (LangChain, LlamaIndex, pydantic-ai, instructor, the OpenAI Agents SDK)
take an openai client and check it with ``isinstance``, read openai's result types
(pydantic models: ``model_dump()``, every field openai declares, ``isinstance(r,
ChatCompletion)``) and map openai's error classes. So these are subclasses of
``openai.OpenAI`` and ``openai.AsyncOpenAI`` whose HTTP client is stormguard's
transport (``_transport/transport.py``): each request is one logical stormguard call (budget,
pacing, deadline, breakers, ejection, fallback models, spans) and what comes back is
openai's own (results, streams, events). The errors are those
``stormguard.Client(openai_errors=True)`` raises: stormguard's own, as classes that are
also openai's (``openai_errors.py``), so ``except openai.RateLimitError`` and ``except
stormguard.RateLimitError`` both catch them. Without openai, ``stormguard.OpenAI`` is
``stormguard.Client`` (``__init__.py``).

They take openai's arguments and stormguard's options (``StormguardOptions``):

* ``base_url`` may list several servers (stormguard's endpoints, ``Endpoint`` objects):
  openai builds its URLs on the first, and the pipeline sends each attempt where it
  chooses;
* ``timeout`` is the total of one call, every attempt and backoff included, as
  ``stormguard.Client``'s (openai's is per attempt). openai sends the timeout with each
  request (its ``timeout`` request extension), which is the call's deadline there, so
  ``with_options(timeout=...)`` and a call's own ``timeout=`` set it as well; a
  ``Timeout``'s ``connect``, ``write`` and ``pool`` bound each attempt;
* ``max_retries=N`` is stormguard's ``RetryPolicy(max_attempts=N + 1)`` (or give
  ``retry_policy``). openai's own retry loop never sends a request again: the
  transport answers each call as final (``x-should-retry: false`` on an error status,
  and openai's error class raised as it is for a failure without one);
* ``http_client``: your own ``httpx``/``httpx2`` client becomes the pool stormguard
  sends its attempts on.

``client.stormguard`` is the stormguard client underneath (``stats()``, the retry
budget), and ``stormguard.call_info(x)`` the ``CallInfo`` of a result, stream, raw
response or error.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

import openai
import pydantic

from .._call.arguments import BaseURL, StormguardOptions
from .._call.client_core import DEFAULT_TIMEOUT
from .._call.openai_conventions import NOT_GIVEN, is_omitted
from .._client.async_client import AsyncClient
from .._client.call_info_lookup import CALL_INFO_ATTRIBUTE
from .._client.client import Client
from .._core.compat import Unpack
from .._core.exceptions import StormguardError
from .._core.http import httpx
from .._core.results import CALL_INFO_EXTENSION
from .._policies.routing.deployment import Deployment
from .answers import ERROR_EXTENSION, for_openai
from .clients import async_http_client_over, http_client_over
from .transport import pipeline_of

if TYPE_CHECKING:
    from .._call.openai_conventions import TimeoutLike, Unset
    from .._core.http import LimitsLike

__all__ = ["AsyncOpenAI", "OpenAI", "OpenAIError", "OpenAIOptions"]

#: ``stormguard.OpenAIError``: the base of every error ``OpenAI`` raises, stormguard's
#: (as the classes that are also openai's) and openai's own (``LengthFinishReasonError``
#: of ``.parse()``), so ``import stormguard as openai`` keeps ``except
#: openai.OpenAIError`` working.
OpenAIError = openai.OpenAIError

P = TypeVar("P", Client, AsyncClient)


class OpenAIOptions(StormguardOptions, total=False):
    """What ``stormguard.OpenAI`` takes beside openai's common arguments: stormguard's
    options, the size of its own pool, and openai's rarer arguments (passed on)."""

    connection_limits: LimitsLike | None
    #: Accepted for code written for ``stormguard.Client``; always on here.
    openai_errors: bool
    websocket_base_url: str | None
    webhook_secret: str | None


def _attempt_bounds(timeout: object) -> Any:
    """The part of an openai ``timeout`` stormguard's client keeps: a ``Timeout``'s
    bounds of each attempt (its ``read`` is the call's total, which openai sends with
    each request); None for a number."""
    if timeout is None or isinstance(timeout, (int, float)) or is_omitted(timeout):
        return None
    parts = {part: getattr(timeout, part, None) for part in ("connect", "write", "pool")}
    return httpx.Timeout(None, **parts)


def _pipeline(
    kind: type[P],
    wrap: Callable[[P], Any],
    kwargs: dict[str, Any],
) -> tuple[P, Any]:
    """The stormguard client (``kind``) under a new openai client, and the HTTP client
    over it; ``kwargs`` (openai's and stormguard's arguments) loses stormguard's."""
    if kwargs.pop("openai_errors", True) is not True:
        raise TypeError(
            "stormguard.OpenAI raises errors that are openai's classes always"
            " (openai_errors=True changes nothing): for stormguard's own, use stormguard.Client"
        )
    options = {name: kwargs.pop(name) for name in list(kwargs) if name in _OWN}
    http_client = kwargs.pop("http_client", None)
    timeout, max_retries = kwargs.get("timeout"), kwargs.get("max_retries", NOT_GIVEN)
    given_retries = not is_omitted(max_retries)
    bounds = _attempt_bounds(timeout)
    existing = pipeline_of(http_client)
    if existing is not None:
        # openai's with_options()/copy(), or stormguard's own httpx_client(): share it.
        if options:
            raise TypeError(
                f"an http_client made by stormguard carries its options: give"
                f" {sorted(options)} to it, or no http_client"
            )
        if not isinstance(existing, kind):
            raise TypeError(f"http_client runs a {type(existing).__name__}, not a {kind.__name__}")
        changes: dict[str, Any] = {}
        if given_retries and max_retries != existing.max_retries:
            changes["max_retries"] = max_retries
        if bounds is not None:
            changes["timeout"] = bounds
        if not changes:
            return existing, http_client
        derived = existing.with_options(**changes)
        return derived, wrap(derived)
    api_key = kwargs.get("api_key")
    pipeline = kind(
        base_url=kwargs.pop("base_url", None),
        api_key=api_key if isinstance(api_key, str) else None,
        timeout=bounds,
        http_client=http_client,
        **({"max_retries": max_retries} if given_retries else {}),
        **options,
    )
    return pipeline, wrap(pipeline)


#: The key openai's client is given when every endpoint is a ``Deployment`` with
#: its own (``Deployment`` never sends a client's key, so this is never sent).
DEPLOYMENTS_KEY = "stormguard-deployments-send-their-own-keys"

#: The options that go to the stormguard client, not to openai's.
_OWN = frozenset(StormguardOptions.__annotations__) | {"connection_limits"}


def _openai_arguments(pipeline: Client | AsyncClient, kwargs: dict[str, Any]) -> None:
    """openai's arguments, completed from the stormguard client: the base URL of its
    first endpoint, its API key (``STORMGUARD_API_KEY`` too), its retries, and its
    default total (stormguard's, not openai's 600 s per attempt)."""
    if kwargs.get("base_url") is None:
        kwargs["base_url"] = pipeline.base_url
    if kwargs.get("api_key") is None and pipeline.api_key is not None:
        kwargs["api_key"] = pipeline.api_key
    endpoints = pipeline._core.endpoints
    if kwargs.get("api_key") is None and all(isinstance(e, Deployment) for e in endpoints):
        # openai's client insists on a key; a deployment sends its own and never this.
        kwargs["api_key"] = DEPLOYMENTS_KEY
    if is_omitted(kwargs.get("max_retries", NOT_GIVEN)):
        kwargs["max_retries"] = pipeline.max_retries
    if is_omitted(kwargs.get("timeout", NOT_GIVEN)):
        kwargs["timeout"] = DEFAULT_TIMEOUT


def _stormguard_error(response: object) -> StormguardError | None:
    """The error the transport failed ``response``'s call with, if it answered one."""
    extensions = getattr(response, "extensions", None)
    error = extensions.get(ERROR_EXTENSION) if isinstance(extensions, Mapping) else None
    return error if isinstance(error, StormguardError) else None


def _with_call_info(result: Any, response: object) -> Any:
    """``result`` (what openai parsed), with its call's ``CallInfo`` kept on it when it
    is one of openai's models."""
    if isinstance(result, pydantic.BaseModel):
        extensions = getattr(response, "extensions", None)
        info = extensions.get(CALL_INFO_EXTENSION) if isinstance(extensions, Mapping) else None
        if info is not None:
            # Not a field: model_dump(), equality and copies do not see it.
            object.__setattr__(result, CALL_INFO_ATTRIBUTE, info)
    return result


class OpenAI(openai.OpenAI):
    """``openai.OpenAI`` over stormguard's pipeline (module doc)."""

    def __init__(
        self,
        *,
        api_key: str | None = None,
        organization: str | None = None,
        project: str | None = None,
        base_url: BaseURL | None = None,
        timeout: float | TimeoutLike | Unset | None = NOT_GIVEN,
        max_retries: int | Unset = NOT_GIVEN,
        default_headers: Mapping[str, str] | None = None,
        default_query: Mapping[str, object] | None = None,
        http_client: Any = None,
        **options: Unpack[OpenAIOptions],
    ) -> None:
        kwargs: dict[str, Any] = dict(
            options,
            api_key=api_key,
            organization=organization,
            project=project,
            base_url=base_url,
            timeout=timeout,
            max_retries=max_retries,
            default_headers=default_headers,
            default_query=default_query,
            http_client=http_client,
        )
        pipeline, kwargs["http_client"] = _pipeline(Client, http_client_over, kwargs)
        _openai_arguments(pipeline, kwargs)
        self._stormguard = pipeline
        super().__init__(**kwargs)

    @property
    def stormguard(self) -> Client:
        """The stormguard client every request runs through: ``stats()``, its retry
        budget, its concurrency limiter."""
        return self._stormguard

    def _make_status_error(
        self, err_msg: str, *, body: object, response: Any
    ) -> openai.APIStatusError:
        error = _stormguard_error(response)
        if error is None:
            return super()._make_status_error(err_msg, body=body, response=response)
        # The call's own error, as stormguard.Client(openai_errors=True) raises it.
        return for_openai(error, response.request)  # type: ignore[return-value]

    def _process_response(self, **kwargs: Any) -> Any:
        return _with_call_info(super()._process_response(**kwargs), kwargs.get("response"))


class AsyncOpenAI(openai.AsyncOpenAI):
    """``openai.AsyncOpenAI`` over stormguard's pipeline (module doc)."""

    def __init__(
        self,
        *,
        api_key: str | None = None,
        organization: str | None = None,
        project: str | None = None,
        base_url: BaseURL | None = None,
        timeout: float | TimeoutLike | Unset | None = NOT_GIVEN,
        max_retries: int | Unset = NOT_GIVEN,
        default_headers: Mapping[str, str] | None = None,
        default_query: Mapping[str, object] | None = None,
        http_client: Any = None,
        **options: Unpack[OpenAIOptions],
    ) -> None:
        kwargs: dict[str, Any] = dict(
            options,
            api_key=api_key,
            organization=organization,
            project=project,
            base_url=base_url,
            timeout=timeout,
            max_retries=max_retries,
            default_headers=default_headers,
            default_query=default_query,
            http_client=http_client,
        )
        pipeline, kwargs["http_client"] = _pipeline(AsyncClient, async_http_client_over, kwargs)
        _openai_arguments(pipeline, kwargs)
        self._stormguard = pipeline
        super().__init__(**kwargs)

    @property
    def stormguard(self) -> AsyncClient:
        """The stormguard client every request runs through (``OpenAI.stormguard``)."""
        return self._stormguard

    def _make_status_error(
        self, err_msg: str, *, body: object, response: Any
    ) -> openai.APIStatusError:
        error = _stormguard_error(response)
        if error is None:
            return super()._make_status_error(err_msg, body=body, response=response)
        return for_openai(error, response.request)  # type: ignore[return-value]

    async def _process_response(self, **kwargs: Any) -> Any:
        result = await super()._process_response(**kwargs)
        return _with_call_info(result, kwargs.get("response"))
