"""openai-python's calling conventions, decided once for ``Client`` and ``AsyncClient``.

Code written for openai-python passes arguments the way it does: ``NOT_GIVEN`` or
``omit`` for "leave this out", a ``timeout`` that is a number or an
``httpx.Timeout``, ``max_retries=N``, ``extra_query``. This module turns each into
what stormguard means by it, in one place.

Timeouts: stormguard's ``timeout`` is the **total** time of one logical call,
every attempt and backoff included; openai's is per attempt, with connect, read,
write and pool parts. A number is the total. A ``Timeout`` (httpx's, or httpx2's
as openai 3.x re-exports it: anything with ``connect``, ``read``, ``write`` and
``pool``) gives its ``read`` as the total (the wait for an answer is what an LLM
call spends its time on; ``None`` means no limit) and its ``connect``, ``write``
and ``pool`` as bounds of each attempt, each also cut to what is left of the
total. So ``httpx.Timeout(10, connect=2)`` is a call of at most 10 s whose every
connect takes at most 2 s; openai's own default, ``Timeout(600, connect=5)``,
is a call of at most 600 s.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from .._core.http import httpx
from .._policies.retry.retry import RetryPolicy

__all__ = [
    "NOT_GIVEN",
    "AttemptTimeouts",
    "NotGiven",
    "Omit",
    "TimeoutLike",
    "Unset",
    "check_timeout",
    "drop_omitted",
    "is_omitted",
    "omit",
    "path_with_query",
    "retry_policy_from",
    "split_timeout",
]


class NotGiven:
    """Sentinel for "argument not passed" where None is a meaningful value
    (openai-python's ``NOT_GIVEN``, which stormguard also accepts)."""

    _instance: NotGiven | None = None

    def __new__(cls) -> NotGiven:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __bool__(self) -> Literal[False]:
        return False

    def __repr__(self) -> str:
        return "NOT_GIVEN"


NOT_GIVEN = NotGiven()


class Omit:
    """Sentinel for "leave this out of the request" (openai-python's ``omit``)."""

    _instance: Omit | None = None

    def __new__(cls) -> Omit:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __bool__(self) -> Literal[False]:
        return False

    def __repr__(self) -> str:
        return "omit"


omit = Omit()


class _FalseSentinel(Protocol):
    """The shape of openai-python's ``NOT_GIVEN`` and ``omit``: an object that is
    always false. Matched by shape, so stormguard imports openai neither to run nor
    to type-check, and openai's sentinels type-check where stormguard's do."""

    def __bool__(self) -> Literal[False]: ...


#: "Not given" or "leave it out", stormguard's sentinels or openai-python's.
Unset = NotGiven | Omit | _FalseSentinel


def _openai_sentinels() -> tuple[type, ...]:
    """openai-python's ``NotGiven`` and ``Omit`` classes, if openai is imported.
    Looked up in ``sys.modules``: a value can only be one of them once openai is
    loaded, so stormguard never imports openai itself."""
    module = sys.modules.get("openai._types")
    if module is None:
        return ()
    return tuple(
        cls
        for cls in (getattr(module, "NotGiven", None), getattr(module, "Omit", None))
        if isinstance(cls, type)
    )


#: ``_omitted_types()`` with the ``openai._types`` module it was built from (None: not
#: imported): built again only when that module changes, not on each of the half a
#: dozen looks a call takes.
_omitted: tuple[object, tuple[type, ...]] = (None, (NotGiven, Omit))


def _omitted_types() -> tuple[type, ...]:
    global _omitted
    module, types = _omitted
    if sys.modules.get("openai._types") is not module:
        module = sys.modules.get("openai._types")
        sentinels = _openai_sentinels()
        types = (NotGiven, Omit, *sentinels)
        if module is None or len(sentinels) == 2:  # not a module half imported
            _omitted = (module, types)
    return types


def is_omitted(value: object) -> bool:
    """Whether ``value`` is stormguard's or openai's ``NOT_GIVEN`` or ``omit``."""
    return isinstance(value, _omitted_types())


def drop_omitted(value: Any) -> Any:
    """``value`` without the omitted entries of its dicts, at any depth (lists are
    walked too: ``messages`` holds dicts). Always a copy of its dicts and lists, so
    nothing the call changes reaches the caller's own."""
    return _dropped(value, _omitted_types())


def _dropped(value: Any, omitted: tuple[type, ...]) -> Any:
    # The sentinel classes are looked up once per walk, not once per value; a plain
    # dict, list or string (nearly every value of a request) is told by its exact
    # type before the ABC check (``Mapping`` costs ~10x ``type(...) is dict``).
    cls = type(value)
    if cls is str:
        return value
    if cls is dict or (cls is not list and isinstance(value, Mapping)):
        return {k: _dropped(v, omitted) for k, v in value.items() if not isinstance(v, omitted)}
    if cls is list or isinstance(value, (list, tuple)):
        return [_dropped(item, omitted) for item in value]
    return value


def check_timeout(value: object, name: str) -> float | None:
    """A number of seconds, or None for no limit (``inf`` is no limit too)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(
            f"{name} must be a number of seconds, an httpx.Timeout or None,"
            f" got {type(value).__name__}"
        )
    if math.isnan(value) or value <= 0:
        raise ValueError(f"{name} must be positive, got {value!r}")
    return None if math.isinf(value) else float(value)


class TimeoutLike(Protocol):
    """An ``httpx.Timeout`` or an ``httpx2.Timeout`` (``openai.Timeout``)."""

    @property
    def connect(self) -> float | None: ...

    @property
    def read(self) -> float | None: ...

    @property
    def write(self) -> float | None: ...

    @property
    def pool(self) -> float | None: ...


@dataclass(frozen=True, slots=True)
class AttemptTimeouts:
    """Bounds of each attempt's connect, write and pool wait (None: only the total)."""

    connect: float | None = None
    write: float | None = None
    pool: float | None = None

    def for_attempt(self, remaining: float) -> dict[str, float | None]:
        """The timeouts of one attempt, as the ``timeout`` request extension httpx and
        httpx2 both read: each operation may take what is left of the call, and no
        more than its own bound. A plain dict: an ``httpx.Timeout`` built and turned
        into one for every attempt cost more than the rest of the choice."""
        if not math.isfinite(remaining):
            return {"connect": self.connect, "read": None, "write": self.write, "pool": self.pool}
        connect, write, pool = self.connect, self.write, self.pool
        return {
            "connect": remaining if connect is None or connect > remaining else connect,
            "read": remaining,
            "write": remaining if write is None or write > remaining else write,
            "pool": remaining if pool is None or pool > remaining else pool,
        }


def _is_timeout_like(value: object) -> bool:
    return all(hasattr(value, part) for part in ("connect", "read", "write", "pool"))


def split_timeout(
    value: object, name: str = "timeout"
) -> tuple[float | None, AttemptTimeouts | None]:
    """The total of a call and its per-attempt bounds (None: the client's), from a
    number, None or a ``Timeout`` (module doc)."""
    if isinstance(value, (int, float)) or value is None:
        return check_timeout(value, name), None
    if not _is_timeout_like(value):
        check_timeout(value, name)  # raises the TypeError
    parts = {
        part: check_timeout(getattr(value, part), f"{name}.{part}")
        for part in ("connect", "read", "write", "pool")
    }
    return parts["read"], AttemptTimeouts(parts["connect"], parts["write"], parts["pool"])


def retry_policy_from(
    retry_policy: RetryPolicy | None, max_retries: int | NotGiven, base: RetryPolicy | None = None
) -> RetryPolicy:
    """``RetryPolicy(max_attempts=max_retries + 1)`` (on ``base``'s other settings),
    or ``retry_policy``, or ``base``: openai's ``max_retries`` as a shorthand."""
    if isinstance(max_retries, NotGiven):
        return retry_policy or base or RetryPolicy()
    if retry_policy is not None:
        raise TypeError(
            "pass max_retries or retry_policy, not both"
            " (max_retries=N is RetryPolicy(max_attempts=N + 1))"
        )
    if isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0:
        raise ValueError(f"max_retries must be a whole number >= 0, got {max_retries!r}")
    return dataclasses.replace(base or RetryPolicy(), max_attempts=max_retries + 1)


def _query_value(value: object) -> Any:
    if isinstance(value, (list, tuple)):
        return ["" if item is None else item for item in value]
    return "" if value is None else value


def path_with_query(path: str, *queries: Mapping[str, object] | None) -> str:
    """``path`` with the query parameters of ``queries`` (later ones win, omitted
    values left out; lists repeat the key, None sends an empty value, as openai's
    ``extra_query`` does)."""
    merged: dict[str, Any] = {}
    for query in queries:
        if query:
            merged.update(drop_omitted(query))
    if not merged:
        return path
    params = httpx.QueryParams({name: _query_value(value) for name, value in merged.items()})
    return f"{path}?{params}"
