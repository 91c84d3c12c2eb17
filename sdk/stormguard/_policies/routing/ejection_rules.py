"""Ejection's rules, without state: what an attempt says about its endpoint, when
an endpoint is ejected, whether it may be, and for how long.

The ``EjectionTracker`` (``_policies/routing/ejection.py``) holds the records and the lock and
asks these functions; each reads the records it is given and changes none.

A shed (429/503 for capacity, a restarting engine) is neither success nor
failure here: overload is not connectivity, and the concurrency limit paces it.

The success-rate rule is Envoy's (``mean - stdev_factor * stdev`` of the
endpoints' success rates, each over at least ``min_requests`` calls), changed
in two ways for the small fleets LLM servers come in. The mean and deviation
are those of the *other* endpoints: with Envoy's own, one sick host of two
raises the deviation enough to hide itself ({50 %, 100 %}: mean 75, stdev 25,
threshold 27.5), which is why Envoy needs five hosts before it judges any.
And the gap below the mean is at least ``success_rate_margin`` (0.3): with
the others at 100 % the deviation is 0, and a single failure must not eject.
With 20 % transient errors everywhere, an endpoint is ejected on noise only
when 6 of its 10 calls fail (0.6 % of windows of 10); one failing half its
calls is out after about five failures.

Two of the rules that keep ejection from making things worse live here
(Envoy's and gRPC's; the third, probation, is the tracker's):

* never the last endpoint of a model: an endpoint is ejected only while every
  model it serves is still served by another endpoint in rotation; a client
  with one endpoint is never ejected (its breaker fails calls fast instead);
* at most ``max_ejected_share`` (0.5) of the endpoints ejected on failures at
  once, but always one (gRPC's A50): past half the fleet, failures more likely
  have a common cause (the requests, a dependency) than many sick replicas,
  and ejecting more would pile the whole load on the few left. Unreachable
  endpoints do not count against the share: they serve nothing either way
  (gRPC keeps connectivity apart from outlier ejection the same way).
"""

from __future__ import annotations

import enum
import math
import random
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from ..._core.exceptions import APIConnectionError, APITimeoutError
from ..._core.verdict import Verdict, classify
from ...protocol import Priority
from .ejection_status import EndpointStatus

if TYPE_CHECKING:
    from .ejection_config import EjectionConfig
    from .ejection_status import _Record
    from .endpoint_state import EndpointState

__all__ = [
    "UNREACHABLE",
    "Evidence",
    "ejection_time",
    "evidence_of",
    "has_later_tier",
    "may_eject",
    "next_reconnect_backoff",
    "reason_to_eject",
    "reconnect_wait",
]

#: The reason of an ejection for unreachability: a connect check, not time, ends it.
UNREACHABLE = "unreachable"


class Evidence(str, enum.Enum):
    """What one attempt says about its endpoint."""

    SUCCESS = "success"
    #: A crash-like failure of a server that answered (``Verdict.breaker_failure``).
    FAILURE = "failure"
    #: Refused, or reset before any byte of the response.
    UNREACHABLE = "unreachable"
    #: A 429 ``insufficient_quota``: the account it uses has no credit.
    OUT_OF_QUOTA = "out_of_quota"
    #: Nothing: a shed, a caller error, a refusal made in this process.
    NONE = "none"


def evidence_of(
    error: BaseException | None, *, response_seen: bool, verdict: Verdict | None = None
) -> Evidence:
    """The evidence of an attempt that ended in ``error`` (None: it succeeded);
    ``response_seen``: whether any of the response (its status line) had arrived.
    A failure counts as the breaker counts it (``verdict``, the attempt's one
    classification, made here when not given); what ejection adds is whether the
    server could be reached at all."""
    if error is None:
        return Evidence.SUCCESS
    if (
        isinstance(error, APIConnectionError)
        and not isinstance(error, APITimeoutError)
        and not response_seen
    ):
        return Evidence.UNREACHABLE
    verdict = verdict if verdict is not None else classify(error)
    if verdict.breaker_failure:
        return Evidence.FAILURE
    if verdict.out_of_quota:
        return Evidence.OUT_OF_QUOTA
    return Evidence.NONE


# -- whether a failure ejects ------------------------------------------------------------


def reason_to_eject(
    state: EndpointState,
    record: _Record,
    evidence: Evidence,
    *,
    states: Callable[[], Iterable[EndpointState]],
    config: EjectionConfig,
) -> str | None:
    """Why the failure just counted in ``record`` ejects ``state`` (None: it does not)."""
    if evidence is Evidence.UNREACHABLE:
        return UNREACHABLE
    if evidence is Evidence.OUT_OF_QUOTA:
        # Its account has no credit; a deployment of a later tier may have some.
        return "out_of_quota" if has_later_tier(state, states()) else None
    if record.status is EndpointStatus.PROBATION:
        return "probation_failed"
    if config.consecutive_failures is not None and (
        record.consecutive >= config.consecutive_failures
    ):
        return "consecutive_failures"
    if config.success_rate and _outlier(state, record, states, config):
        return "success_rate"
    if config.failure_rate is not None and _failing(record, config.failure_rate, config):
        # Envoy's failure-percentage rule, for a deployment with a later tier: that
        # tier's deployments take no calls while this one is in rotation, so the
        # success-rate rule has nobody to compare it with.
        return "failure_rate" if has_later_tier(state, states()) else None
    return None


def _failing(record: _Record, threshold: float, config: EjectionConfig) -> bool:
    successes, failures = record.window.totals()
    calls = successes + failures
    return calls >= config.min_requests and failures >= threshold * calls


def has_later_tier(state: EndpointState, states: Iterable[EndpointState]) -> bool:
    """Whether every model ``state`` serves is also served by an endpoint of a later
    tier in rotation: calls that leave ``state``'s tier have somewhere to go."""
    later = [s for s in states if s.tier > state.tier and not _ejected(s)]
    if not later:
        return False
    models: Iterable[str | None] = (None,) if state.models is None else state.models
    return all(
        any((s.models is None) if model is None else s.serves(model) for s in later)
        for model in models
    )


def _outlier(
    state: EndpointState,
    record: _Record,
    states: Callable[[], Iterable[EndpointState]],
    config: EjectionConfig,
) -> bool:
    """Envoy's success-rate rule against the other endpoints (the module docstring)."""
    successes, failures = record.window.totals()
    calls = successes + failures
    if calls < config.min_requests:
        return False
    rates: list[float] = []
    for other in states():
        theirs = other.ejection
        if other is state or theirs is None or theirs.status is EndpointStatus.EJECTED:
            continue
        ok, failed = theirs.window.totals()
        if ok + failed >= config.min_requests:
            rates.append(ok / (ok + failed))
    if not rates:
        return False
    import statistics  # only with several endpoints to compare: not on import

    mean, stdev = statistics.fmean(rates), statistics.pstdev(rates)
    threshold = mean - max(config.stdev_factor * stdev, config.success_rate_margin)
    return successes / calls < threshold


# -- whether it may be ejected -----------------------------------------------------------


def may_eject(
    state: EndpointState,
    states: Iterable[EndpointState],
    config: EjectionConfig,
    *,
    counted: bool,
) -> bool:
    """Never the last endpoint of a model, nor of a pool (a priority class, for
    that model); failures (``counted``) eject at most the share."""
    states = list(states)
    serving = [s for s in states if s is not state and not _ejected(s)]
    models: Iterable[str | None] = (None,) if state.models is None else state.models
    classes = tuple(Priority) if state.classes is None else state.classes
    for model in models:
        # An endpoint serving any model is covered only by another one that does.
        peers = [s for s in serving if (s.models is None if model is None else s.serves(model))]
        if not all(any(s.serves_class(c) for s in peers) for c in classes):
            return False
    if not counted or has_later_tier(state, states):
        # A deployment's whole tier may leave when a later tier serves its models:
        # one provider's outage is the common cause failover is for.
        return True
    ejected = sum(1 for s in states if s is not state and _ejected_on_failures(s))
    return ejected == 0 or (ejected + 1) / len(states) <= config.max_ejected_share


def _ejected(state: EndpointState) -> bool:
    record = state.ejection
    return record is not None and record.status is EndpointStatus.EJECTED


def _ejected_on_failures(state: EndpointState) -> bool:
    record = state.ejection
    return (
        record is not None
        and record.status is EndpointStatus.EJECTED
        and record.reason != UNREACHABLE
    )


# -- for how long ------------------------------------------------------------------------


def next_reconnect_backoff(backoff: float, config: EjectionConfig) -> float:
    """gRPC's connection backoff after one more failed connect: ``reconnect_backoff``
    first (``backoff`` 0: not unreachable since its last success), then
    ``reconnect_multiplier`` times the last, up to ``max_reconnect_backoff``."""
    grown = backoff * config.reconnect_multiplier if backoff else 0.0
    return min(max(grown, config.reconnect_backoff), config.max_reconnect_backoff)


def reconnect_wait(backoff: float, config: EjectionConfig, rng: random.Random) -> float:
    """Seconds until the next connect check: ``backoff`` +-``reconnect_jitter``."""
    spread = config.reconnect_jitter * backoff
    return backoff + rng.uniform(-spread, spread)


def ejection_time(
    multiplier: int, healthy_for: float, config: EjectionConfig, rng: random.Random
) -> tuple[int, float]:
    """``(multiplier, seconds)`` of an ejection on failures. Envoy's multiplier: one
    more per ejection, one less per ``interval`` spent back in rotation
    (``healthy_for``); the time is lengthened by up to ``jitter``, never shortened."""
    fell = int(healthy_for // config.interval) if math.isfinite(healthy_for) else multiplier
    multiplier = max(multiplier - fell, 0) + 1
    grown = min(config.base_ejection_time * multiplier, config.max_ejection_time)
    return multiplier, grown * rng.uniform(1.0, 1.0 + config.jitter)
