"""stormguard's errors as openai-python's too: ``Client(openai_errors=True)``.

stormguard raises its own exception classes, with openai-python's names and
attributes, so code that catches ``openai.RateLimitError`` ports by importing
``stormguard as openai``. Code that keeps ``import openai`` for its ``except``
clauses (a tenacity wrapper's ``retry_if_exception_type(openai.RateLimitError)``,
a framework's handler of ``openai.APIError``) catches nothing that
``stormguard.Client`` raises. With ``openai_errors=True`` it does: every error a
call raises, at the one place where it leaves the call, takes a class that
derives from stormguard's class first and openai's matching class second::

    class RateLimitError(stormguard.RateLimitError, openai.RateLimitError): ...

so ``except stormguard.RateLimitError`` and ``except openai.RateLimitError`` both
catch it, and every attribute reads as before (stormguard's ``__init__`` built it;
openai's is never called). The object is the same one: only its class changes.
``type(err)`` is this module's class of the same name (``type(err) is
stormguard.RateLimitError`` is False), ``repr`` and ``str`` are unchanged.

openai's tree has no class for a refusal made in this process (an open breaker,
the throttle, a full local queue, the token rate limit, the key's quota): each
takes the nearest openai class, ``APIConnectionError`` ("no response came back"),
or ``APITimeoutError`` for the two that are a wait past the deadline; a cut stream is
an ``APIConnectionError``, a 503 an ``InternalServerError`` (openai's has no 503
class). Those that are not stormguard ``APIError`` s read ``request``, ``body``,
``code``, ``param``, ``type`` and ``request_id`` as None. ``OPENAI_CLASSES`` is the
whole table; docs/errors.md explains it.

The classes are built once, when a client asks for them (openai is imported
then, never before); without the openai package that client's construction
fails with an ``ImportError`` that says so.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeVar, cast

from ._core import exceptions as sg
from ._core.fork import fork_safe_lock

if TYPE_CHECKING:
    from types import ModuleType

__all__ = ["OPENAI_CLASSES", "as_openai_error", "openai_class", "openai_errors_option"]

E = TypeVar("E", bound=sg.StormguardError)

#: Each stormguard class, and the name of the openai class it also becomes.
OPENAI_CLASSES: dict[type[sg.StormguardError], str] = {
    sg.StormguardError: "APIError",
    sg.APIError: "APIError",
    sg.APIConnectionError: "APIConnectionError",
    sg.APITimeoutError: "APITimeoutError",
    sg.ClientClosedError: "APIConnectionError",
    sg.EventLoopMismatchError: "APIConnectionError",
    sg.QueueTimeoutError: "APITimeoutError",
    sg.APIResponseValidationError: "APIResponseValidationError",
    sg.StreamInterruptedError: "APIConnectionError",
    sg.APIStatusError: "APIStatusError",
    sg.BadRequestError: "BadRequestError",
    sg.ContextWindowExceededError: "BadRequestError",
    sg.AuthenticationError: "AuthenticationError",
    sg.PermissionDeniedError: "PermissionDeniedError",
    sg.NotFoundError: "NotFoundError",
    sg.ConflictError: "ConflictError",
    sg.UnprocessableEntityError: "UnprocessableEntityError",
    sg.RateLimitError: "RateLimitError",
    sg.InternalServerError: "InternalServerError",
    sg.ServiceUnavailableError: "InternalServerError",
    sg.RefusedBeforeSendError: "APIConnectionError",
    sg.CircuitOpenError: "APIConnectionError",
    sg.ThrottledError: "APIConnectionError",
    sg.LocalQueueFullError: "APIConnectionError",
    sg.TokenRateLimitedError: "APITimeoutError",
    sg.QuotaWaitError: "APITimeoutError",
}

#: openai's ``APIError`` attributes that a stormguard error outside ``APIError`` lacks.
_NO_API_FIELDS = {name: None for name in ("request", "body", "code", "param", "type", "request_id")}

_lock = fork_safe_lock()
#: stormguard class -> its class that is also openai's; None until a client asks.
_built: dict[type[sg.StormguardError], type[sg.StormguardError]] | None = None


def _import_openai() -> ModuleType:
    try:
        import openai
    except ImportError as exc:
        raise ImportError(
            "openai_errors=True makes stormguard's errors openai-python's classes too,"
            " and needs the openai package: pip install openai"
        ) from exc
    return openai


def _classes() -> dict[type[sg.StormguardError], type[sg.StormguardError]]:
    """The table of classes, built on first use (under a lock: one class per name)."""
    global _built
    if _built is not None:
        return _built
    with _lock:
        if _built is None:
            _built = _build(_import_openai())
    return _built


def _build(openai: ModuleType) -> dict[type[sg.StormguardError], type[sg.StormguardError]]:
    table: dict[type[sg.StormguardError], type[sg.StormguardError]] = {}
    for ours, name in OPENAI_CLASSES.items():
        namespace: dict[str, Any] = {
            "__module__": __name__,
            "__qualname__": ours.__name__,
            "__doc__": f"stormguard's {ours.__name__} that is also openai.{name}.",
        }
        if not issubclass(ours, sg.APIError):
            namespace.update(_NO_API_FIELDS)
        built = type(ours.__name__, (ours, getattr(openai, name)), namespace)
        table[ours] = cast("type[sg.StormguardError]", built)
    return table


def openai_class(cls: type[E]) -> type[E]:
    """The class deriving from stormguard's ``cls`` and its openai class (``KeyError``
    for a class outside ``OPENAI_CLASSES``). Imports openai on first use."""
    return cast("type[E]", _classes()[cls])


def as_openai_error(error: E) -> E:
    """``error`` itself, its class changed to the one that is also openai's; an error
    of any other class (already converted, or a subclass stormguard does not raise) is
    left as it is."""
    cls = _classes().get(type(error))
    if cls is not None:
        error.__class__ = cast("type[E]", cls)
    return error


def openai_errors_option(value: bool) -> bool:
    """Check a client's ``openai_errors`` option; when on, build the classes now, so a
    missing openai package fails the client's construction, not its first error."""
    if not isinstance(value, bool):
        raise TypeError(f"openai_errors must be True or False, got {type(value).__name__}")
    if value:
        _classes()
    return value


def __getattr__(name: str) -> type[sg.StormguardError]:
    """``stormguard.openai_errors.RateLimitError``: the built class of that name (this
    is where pickle and the class's ``__module__`` find it)."""
    for ours in OPENAI_CLASSES:
        if ours.__name__ == name:
            return _classes()[ours]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
