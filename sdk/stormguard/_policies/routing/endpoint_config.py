"""What a client is told about its servers, checked when it is made: each
``Endpoint`` (its URL, weight, and the models and priority classes it serves),
and ``SpillOver``, when a call may use another class's endpoints."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from ..._core.redact import display_url
from ...protocol import Priority, ServerLoad

__all__ = ["Endpoint", "SpillOver", "check_served", "priority_classes"]


def priority_classes(classes: Collection[Priority | str]) -> frozenset[Priority]:
    """The priority classes named in ``classes``; a clear error for anything else."""
    if isinstance(classes, str):
        raise TypeError("classes must be a collection of priority classes, not one string")
    found: set[Priority] = set()
    for value in classes:
        try:
            found.add(Priority(value))
        except ValueError:
            valid = ", ".join(p.value for p in Priority)
            raise ValueError(
                f"a class is an x-priority value ({valid}), got {str(value)[:50]!r}"
            ) from None
    if not found:
        raise ValueError("classes is empty: give at least one class, or None for every class")
    return frozenset(found)


@dataclass(frozen=True)
class Endpoint:
    """One server the client may send to.

    >>> Endpoint("http://10.0.0.5:8000/v1", weight=2.0).weight
    2.0
    """

    base_url: str
    weight: float = 1.0
    #: Shown in attempt records, breaker names and stats; ``host:port`` by default.
    name: str | None = None
    #: The models this server serves (None: any). A call goes only to endpoints that
    #: serve its model, so a fallback model can live on another pool of servers.
    models: Collection[str] | None = None
    #: The priority classes it serves (``x-priority`` values; None: every class). A
    #: call goes to the endpoints of its own class (``SpillOver`` for the exception).
    classes: Collection[Priority | str] | None = None

    def __post_init__(self) -> None:
        if not (self.weight > 0 and self.weight < float("inf")):
            raise ValueError(f"endpoint weight must be a positive number, got {self.weight!r}")
        if self.models is not None:
            if isinstance(self.models, str):
                raise TypeError("models must be a collection of model names, not one string")
            object.__setattr__(self, "models", frozenset(self.models))
        if self.classes is not None:
            object.__setattr__(self, "classes", priority_classes(self.classes))

    def serves(self, model: str | None, priority: Priority | None = None) -> bool:
        return (self.models is None or model is None or model in self.models) and (
            self.classes is None or priority is None or priority in self.classes
        )

    def __repr__(self) -> str:
        # Never a password in the URL (http://user:KEY@host).
        classes = None if self.classes is None else sorted(Priority(c).value for c in self.classes)
        return (
            f"Endpoint(base_url={display_url(self.base_url)!r}, weight={self.weight!r},"
            f" name={self.name!r}, models={self.models!r}, classes={classes!r})"
        )


def check_served(
    endpoints: Sequence[Endpoint], model: str | None, priority: Priority | None = None
) -> None:
    """ValueError when no endpoint serves ``model`` for ``priority``: a configuration
    mistake, better said when the client is made than as a 404 or an empty pool."""
    if not any(e.serves(model, priority) for e in endpoints):
        raise ValueError(_none_serves(model, priority))


def _none_serves(model: str | None, priority: Priority | None) -> str:
    served = f"no endpoint of this client serves model {model!r}"
    return served if priority is None else f"{served} for priority class {priority.value!r}"


@dataclass(frozen=True)
class SpillOver:
    """When a call may use another class's endpoints: only calls of ``classes``
    (``sheddable`` by default: batch work onto the interactive pool), only when no
    endpoint of their own class has a free slot, and only on an endpoint whose load
    report, at most ``stale_after`` old (5 s), shows headroom: no shed, at most
    ``max_queue_depth`` requests waiting (0), in-flight tokens under
    ``max_token_share`` of its capacity and KV-cache use under ``max_kv_cache_usage``
    (0.8 each: the saturation point llm-d's scheduler uses for KV).

    >>> SpillOver(classes={"sheddable", "standard"}).max_queue_depth
    0
    """

    classes: Collection[Priority | str] = (Priority.SHEDDABLE,)
    max_queue_depth: int = 0
    max_token_share: float = 0.8
    max_kv_cache_usage: float = 0.8

    def __post_init__(self) -> None:
        object.__setattr__(self, "classes", priority_classes(self.classes))
        depth = self.max_queue_depth
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 0:
            raise ValueError(f"max_queue_depth must be an integer >= 0, got {depth!r}")
        for name in ("max_token_share", "max_kv_cache_usage"):
            value = getattr(self, name)
            if (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or not (0.0 < value <= 1.0)
            ):
                raise ValueError(f"{name} must be in (0, 1], got {value!r}")

    def allows(self, priority: Priority) -> bool:
        return priority in self.classes

    def headroom(self, load: ServerLoad | None) -> bool:
        """Whether a (fresh) load report says the server has room for more."""
        if load is None or load.load_shed or load.queue_depth is None:
            return False
        if load.queue_depth > self.max_queue_depth:
            return False
        tokens, capacity = load.inflight_tokens, load.token_capacity
        if tokens is not None and capacity and tokens >= self.max_token_share * capacity:
            return False
        return load.kv_cache_usage is None or load.kv_cache_usage < self.max_kv_cache_usage
