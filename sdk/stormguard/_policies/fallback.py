"""Which model a call moves on to instead of failing, and why: one decision.

Three kinds of refusal send a call to another model, each by its own routes, as
LiteLLM's Router has ``fallbacks``, ``context_window_fallbacks`` and
``content_policy_fallbacks``:

- **unavailable**: the model's servers are open-circuited, shedding, or still
  failing after the retries the budget allowed (the OOM-avalanche incident's
  "degrade to a smaller model"): the next model of ``Fallbacks.models`` serves
  the call and the result says ``degraded=True``. Which failures allow it is one
  field of the outcome's ``Verdict`` (``_core/verdict.py``): not the caller's own
  faults, not an account out of quota.
- **context_window**: the request cannot fit the model, refused here by the token
  pre-check (``ContextWindowExceededError``, nothing sent) or by the server's 400
  ``context_length_exceeded``: a model of ``Fallbacks.context_window`` with a
  longer context serves it. Another replica or provider of the same model would
  refuse it the same way, so it is never retried nor failed over first.
- **content_policy**: a provider's content filter refused the request. It goes
  nowhere else unless a route says so (``Fallbacks.content_policy``): sending a
  refused prompt on to every provider is a decision for its owner to make.

A call tries each model at most once, so a chain of routes always ends.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .._core.history import FallbackKind
from .._core.verdict import TRANSIENT_STATUSES, classify

if TYPE_CHECKING:
    from ..tokens._match import ModelMap

__all__ = [
    "FALLBACK_STATUSES",
    "Fallbacks",
    "is_fallback_worthy",
    "next_fallback",
]

#: Statuses that say "this model's servers cannot serve you now": the transient ones.
FALLBACK_STATUSES = TRANSIENT_STATUSES


def _model_name(value: object, what: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{what} must be a non-empty model name, got {value!r}")
    return value


def _chain(key: str, value: object, what: str) -> tuple[str, ...]:
    names = (value,) if isinstance(value, str) else value
    if not isinstance(names, Iterable):
        raise ValueError(f"{what}[{key!r}] must be a model name or a list of them, got {value!r}")
    chain = tuple(_model_name(n, f"a model of {what}[{key!r}]") for n in names)
    if not chain:
        raise ValueError(f"{what}[{key!r}] is empty: name the model(s) to go to")
    if key in chain:
        raise ValueError(f"{what}[{key!r}] routes the model to itself")
    if len(set(chain)) != len(chain):
        raise ValueError(f"{what}[{key!r}] names a model twice: {list(chain)!r}")
    return chain


def _routes(value: object, what: str) -> Mapping[str, tuple[str, ...]]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ValueError(
            f"{what} must map a model to the model(s) to go to, got {type(value).__name__}"
        )
    return {
        _model_name(key, f"a key of {what}"): _chain(key, chain, what)
        for key, chain in value.items()
    }


@dataclass(frozen=True)
class Fallbacks:
    """Where a call goes when its model refuses it, by why (``fallback_models=``).

    >>> f = Fallbacks(
    ...     models=["llama-3-8b"],
    ...     context_window={"chat-large": ["chat-long"]},
    ...     content_policy={"chat-large": "chat-lenient"},
    ... )
    >>> f.context_window["chat-large"], f.content_policy["chat-large"]
    (('chat-long',), ('chat-lenient',))

    ``models``: in order, when the model's servers cannot serve (the list
    ``fallback_models`` takes). ``context_window``: for each model, the
    longer-context model(s) a request too long for it goes to. ``content_policy``:
    for each model, the model(s) a request its content filter refused goes to; none
    by default. A model name, or a list tried in order; a route of the model a
    call moved to is followed too (``a -> b``, ``b -> c``).
    """

    models: Sequence[str] = ()
    context_window: Mapping[str, Sequence[str] | str] = field(default_factory=dict)
    content_policy: Mapping[str, Sequence[str] | str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if isinstance(self.models, str):
            raise TypeError("models must be a list of model names, not one string")
        models = tuple(_model_name(m, "a model of models") for m in self.models)
        if len(set(models)) != len(models):
            raise ValueError(f"models names a model twice: {list(models)!r}")
        object.__setattr__(self, "models", models)
        object.__setattr__(self, "context_window", _routes(self.context_window, "context_window"))
        object.__setattr__(self, "content_policy", _routes(self.content_policy, "content_policy"))

    @classmethod
    def of(cls, value: Fallbacks | Sequence[str]) -> Fallbacks:
        """``fallback_models=`` as given: a ``Fallbacks``, or the list of ``models``."""
        if isinstance(value, Fallbacks):
            return value
        if isinstance(value, str):
            raise TypeError("fallback_models must be a list of model names, not one string")
        return cls(models=tuple(value))

    def all_models(self) -> tuple[str, ...]:
        """Every model a route may send a call to (each must be served by an endpoint)."""
        seen: dict[str, None] = dict.fromkeys(self.models)
        for routes in (self.context_window, self.content_policy):
            for chain in routes.values():
                seen.update(dict.fromkeys(chain))
        return tuple(seen)


def is_fallback_worthy(error: BaseException) -> bool:
    """True when trying the next model can help (overload, outage, open breaker), not
    for the caller's own faults or an account out of quota."""
    return classify(error).fallback


def next_fallback(
    fallbacks: Fallbacks,
    error: BaseException,
    *,
    model: str | None,
    asked: str | None,
    tried: Collection[str],
    context_fallbacks: ModelMap[str] | None = None,
) -> tuple[str, FallbackKind] | None:
    """The model a call refused with ``error`` on ``model`` goes to, and why; None:
    it fails with ``error``. ``asked`` is the model the call first asked for (its
    routes are followed after ``model``'s), ``tried`` the models it has been on.
    ``context_fallbacks`` is the token policy's map (``TokenPolicy(context_fallbacks=
    ...)``), a route where ``Fallbacks.context_window`` has none for a model."""
    verdict = classify(error)
    candidates: list[str] = []
    if verdict.too_long:
        kind = FallbackKind.CONTEXT_WINDOW
        for name in dict.fromkeys((model, asked)):
            if name is None:
                continue
            chain = fallbacks.context_window.get(name)
            if chain is None and context_fallbacks is not None:
                found = context_fallbacks.lookup(name)
                chain = () if found is None else (found,)
            candidates.extend(chain or ())
    elif verdict.content_policy:
        kind = FallbackKind.CONTENT_POLICY
        for name in dict.fromkeys((model, asked)):
            if name is not None:
                candidates.extend(fallbacks.content_policy.get(name, ()))
    elif verdict.fallback:
        kind = FallbackKind.UNAVAILABLE
        candidates.extend(fallbacks.models)
    else:
        return None
    for candidate in candidates:
        if candidate not in tried and candidate != model:
            return candidate, kind
    return None
