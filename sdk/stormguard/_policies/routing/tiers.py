"""Tiers of deployments: which tier calls go to, said once when it changes, and
what each deployment served (``client.stats().deployments``).

A client's calls go to the best (lowest) tier that can take them
(``_call/endpoint_choice.py``). A tier is **left** when none of its deployments is in
rotation for the call's model: ejected (unreachable, failing, timing out, out of
quota: ``_policies/routing/ejection_rules.py``) or open-circuited. ``TierWatch`` notices when that
changes, from the picks themselves, and logs one line when calls leave the
preferred tier and one when they return to it (per model: a model served by one
provider alone may leave while another stays). Traffic then returns gradually:
the returning deployments' concurrency limits ramp up from their floor, and
what they cannot take yet goes to the next tier (``EndpointLimit.recovering``).

Envoy's priority levels fail over the same way (all traffic on priority 0 while
it is healthy, the rest trickling to priority 1 as its hosts leave), and
LiteLLM's Router tries the deployments of ``order`` 1 before those of ``order`` 2.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..._core import logs as _logs
from ..._core.fork import fork_safe_lock

__all__ = ["DeploymentSnapshot", "TierWatch"]

#: Models whose tier is watched, and deployments counted, at most (past them, the
#: table starts again: a client has a few).
_MAX_MODELS = 256
_MAX_DEPLOYMENTS = 1024


@dataclass(frozen=True, slots=True)
class DeploymentSnapshot:
    """What one deployment did for a client's calls, since the client was made."""

    deployment: str
    tier: int
    #: Attempts sent to it.
    attempts: int
    #: Calls it answered (an attempt that ended ``ok``).
    served: int
    #: Attempts on it after which the call failed over to another deployment.
    failovers: int


class TierWatch:
    """Which tier each model's calls go to, and each deployment's counts; thread-safe."""

    def __init__(self) -> None:
        self._lock = fork_safe_lock()
        #: Per model: the tier it left (its preferred one), while calls go elsewhere.
        self._left: dict[str | None, int] = {}
        #: Per deployment: [tier, attempts, served, failovers].
        self._counts: dict[str, list[int]] = {}

    def observe(
        self,
        model: str | None,
        preferred: int,
        best: int | None,
        why: Callable[[], str],
    ) -> None:
        """A pick for ``model``: ``preferred`` is the lowest tier serving it, ``best``
        the lowest with a deployment in rotation now (None: none). One log line when
        calls leave ``preferred`` and one when they come back (``why`` says why they
        left, asked only then)."""
        leaving = best is None or best > preferred
        with self._lock:
            was = self._left.get(model)
            if (was is not None) == leaving:
                return
            if leaving:
                if len(self._left) >= _MAX_MODELS:
                    self._left.clear()
                self._left[model] = preferred
            else:
                del self._left[model]
        if leaving:
            _logs.tier_left(model=model, tier=preferred, to=best, why=why())
        else:
            _logs.tier_returned(model=model, tier=preferred)

    def attempted(self, deployment: str, tier: int, outcome: str) -> None:
        """An attempt to ``deployment`` ended with ``outcome`` (its record's)."""
        with self._lock:
            counts = self._counts.get(deployment)
            if counts is None:
                if len(self._counts) >= _MAX_DEPLOYMENTS:
                    self._counts.clear()
                counts = self._counts[deployment] = [tier, 0, 0, 0]
            counts[1] += 1
            if outcome == "ok":
                counts[2] += 1
            elif outcome == "failover":
                counts[3] += 1

    def left(self) -> dict[str | None, int]:
        """The models whose calls left their preferred tier, and that tier."""
        with self._lock:
            return dict(self._left)

    def snapshot(self) -> tuple[DeploymentSnapshot, ...]:
        with self._lock:
            return tuple(
                DeploymentSnapshot(name, tier, attempts, served, failovers)
                for name, (tier, attempts, served, failovers) in self._counts.items()
            )
