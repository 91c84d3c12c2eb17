"""Which endpoint an attempt goes to: in rotation (not ejected, breaker
accepting), serving the call's model and class, untried first for a retry, a
free concurrency slot first; and the refusal when none can take it.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

from .._core.exceptions import CircuitOpenError, QuotaWaitError
from .._policies.routing.affinity import DEFAULT_EPSILON, DEFAULT_SLACK
from .call_base import CallBase
from .call_quota import answered_key, credential, current_key, left_pacing, pace_key

if TYPE_CHECKING:
    from collections.abc import Collection

    from .._policies.breaker.circuit import Permit
    from .._policies.quota import Pace, SharedAsk
    from .._policies.quota._bucket import Reply
    from .._policies.routing.endpoint_state import EndpointState


__all__ = [
    "answered",
    "any_endpoint_accepting",
    "breaker_permit",
    "can_retry_elsewhere",
    "has_room_for",
    "hedge_target",
    "own_endpoint",
    "pace",
    "pick_endpoint",
    "skip_credential_of",
    "usable",
]


def pick_endpoint(
    call: CallBase, *, retry: bool = False, untried_only: bool = False
) -> EndpointState:
    """The endpoint of the next attempt. Endpoints that are ejected or whose
    breaker is open are skipped, and with none left the call fails now, with no
    I/O (``CircuitOpenError``). A retry goes to an endpoint the call has not
    tried when one is usable (only such one with ``untried_only``), else to
    another than the last; a requeue avoids the last. Of those, one with a free
    concurrency slot comes first, else the one with the shortest queue. With
    deployments of several tiers, the best tier that can take the call: one
    with a free slot, else one whose queue fits the call's deadline and is not
    ramping back up (``_tier_choice``). With an affinity key, the key's endpoint
    comes first (``EndpointPicker.choose``), and ``call._affinity`` says whether
    the attempt goes to the key's home."""
    core = call.core
    avoid: str | Collection[str] | None = None
    if retry:
        avoid = call._tried
    elif call.attempt_number > 0:
        avoid = call._last_endpoint
    key, affinity = call.spec.affinity_key, core.affinity
    candidates, home = core.picker.choose(
        model=call.spec.model,
        priority=call.priority,
        spill=core.spill_over,
        avoid=avoid,
        usable=partial(usable, call),
        affinity_key=None if affinity is None else key,
        epsilon=DEFAULT_EPSILON if affinity is None else affinity.epsilon,
        slack=DEFAULT_SLACK if affinity is None else affinity.slack,
        latency=core.latency_routing,
        stream=call.spec.stream,
    )
    if call.spec.pin is not None:
        _serving(call)  # a clear error when the pin leaves none of the model's
    elif core.tiered:
        _watch_tiers(call)
    if retry:
        untried = [s for s in candidates if s.name not in call._tried]
        candidates = untried if untried or untried_only else candidates
    if not candidates:
        raise _refusal(call)
    chosen = _with_room(call, candidates)
    if home is not None:
        call._affinity = "hit" if chosen is home else "overflow"
    elif call._affinity is not None:
        call._affinity = None
    return chosen


def _with_room(call: CallBase, candidates: list[EndpointState]) -> EndpointState:
    """Of ``candidates`` (in order), the first with a free concurrency slot; with
    tiers, ``_tier_choice``; with none, the own pool's shortest queue."""
    limiter = call.core.limiter
    if limiter is None or len(candidates) == 1:
        return candidates[0]
    if call.core.tiered and candidates[0].tier != candidates[-1].tier:
        chosen = _tier_choice(call, candidates)
        if chosen is not None:
            return chosen
    for state in candidates:
        if limiter.endpoint(state.name).has_room():
            return state
    # No free slot anywhere: wait in the own pool's shortest queue (another
    # pool's endpoints are spill-over, for room, never to queue on).
    first = [s for s in candidates if s.tier == candidates[0].tier]
    own = [s for s in first if s.serves_class(call.priority)] or first
    return min(own, key=lambda s: limiter.endpoint(s.name).expected_wait())


def _tier_choice(call: CallBase, candidates: list[EndpointState]) -> EndpointState | None:
    """Of ``candidates`` (in tier order), the first with a free slot, tier by tier;
    a tier without one keeps the call in its queue when the queue fits the
    call's deadline and no endpoint of the tier is ramping back up after going
    down (what it cannot take yet goes to the next tier: the gradual return).
    None: no tier can take it now (the best one's queue it is, then)."""
    limiter = call.core.limiter
    assert limiter is not None
    deadline_at = call.deadline.at
    tier: list[EndpointState] = []
    for index, state in enumerate(candidates):
        tier.append(state)
        if limiter.endpoint(state.name).has_room():
            return state
        last = index + 1 == len(candidates) or candidates[index + 1].tier != state.tier
        if not last:
            continue
        own = [s for s in tier if s.serves_class(call.priority)]
        tier = []
        if not own or any(limiter.endpoint(s.name).recovering() for s in own):
            continue
        best = min(own, key=lambda s: limiter.endpoint(s.name).expected_wait())
        if limiter.endpoint(best.name).wait_fits(deadline_at):
            return best
    return None


def _watch_tiers(call: CallBase) -> None:
    """Tell the client's ``TierWatch`` which tier the call's model can go to now."""
    serving = call.core.picker.serving(call.spec.model, call.priority, call.core.spill_over)
    preferred = min(s.tier for s in serving)
    best = min((s.tier for s in serving if _in_rotation(call, s)), default=None)
    call.core.tier_watch.observe(
        call.spec.model, preferred, best, lambda: _why_out(call, serving, preferred)
    )


def _in_rotation(call: CallBase, state: EndpointState) -> bool:
    """Whether ``state`` takes calls of this model now, for every call (ejection,
    breaker), whatever this call's own pin or skips."""
    ejection, registry = call.core.ejection, call.core.breakers
    if ejection is not None and ejection.retry_in(state) is not None:
        return False
    return registry is None or registry.get(state.name, call.spec.model).accepting


def _why_out(call: CallBase, serving: list[EndpointState], tier: int) -> str:
    """Why each endpoint of ``tier`` takes no call: its ejection, or its breaker."""
    ejection, registry = call.core.ejection, call.core.breakers
    reasons = []
    for state in serving:
        if state.tier != tier:
            continue
        record = state.ejection
        wait = None if ejection is None else ejection.retry_in(state)
        if wait is not None and record is not None:
            reasons.append(f"{state.name} ejected ({record.reason}) for {wait:.1f} s")
        elif registry is not None and not registry.get(state.name, call.spec.model).accepting:
            reasons.append(f"{state.name} circuit open")
    return ", ".join(reasons) or "no endpoint in rotation"


def pace(call: CallBase) -> Pace | SharedAsk | None:
    """``call_quota.pace_key``; with deployments, for the key of the deployment the
    attempt will go to (chosen now), and past a deployment whose key cannot fit
    the call's deadline (``QuotaWaitError``) to the next that can take it."""
    if not call.core.tiered or call.core.quota is None:
        return pace_key(call)
    while True:
        if call._next_target is None:
            call.machine.step("pace")  # a refusal here stops the call from PACING
            call._next_target = pick_endpoint(
                call,
                retry=call.attempt_number > 0 and not call._resending,
                untried_only=call._failover,
            )
        current_key(call)  # the call's place in the quota follows the deployment's key
        try:
            return pace_key(call)
        except QuotaWaitError:
            if not skip_credential_of(call, call._next_target):
                raise
            call._next_target = None


def answered(
    call: CallBase, ask: SharedAsk, reply: Reply | BaseException
) -> Pace | SharedAsk | None:
    """``call_quota.answered_key``; with deployments, a key shared in Redis that cannot
    fit the call's deadline passes the call to the next deployment, as ``pace``."""
    try:
        return answered_key(call, ask, reply)
    except QuotaWaitError:
        target = call._next_target
        if not call.core.tiered or target is None or not skip_credential_of(call, target):
            raise
        call._next_target = None
    return pace(call)


def skip_credential_of(call: CallBase, failed: EndpointState) -> bool:
    """This call uses no endpoint sending ``failed``'s credential again (its key
    is out of quota, or its quota cannot fit the deadline); True when another
    endpoint can take the call."""
    if not call.core.tiered or failed.provider is None:
        return False
    serving = _serving(call)
    credential = _credential_of(call, failed)
    call._skipped = call._skipped | {
        s.name for s in serving if s is failed or _credential_of(call, s) == credential
    }
    left_pacing(call)
    return any(usable(call, s) for s in serving)


def _credential_of(call: CallBase, state: EndpointState) -> str | None:
    provider = state.provider
    return credential(call) if provider is None else provider.credential()


def _serving(call: CallBase) -> list[EndpointState]:
    """The endpoints that serve the call's model and class now (spill-over
    included), those its ``Pin`` admits."""
    serving = call.core.picker.serving(call.spec.model, call.priority, call.core.spill_over)
    pin = call.spec.pin
    if pin is None:
        return serving
    pinned = [s for s in serving if pin.admits(s)]
    if not pinned:  # a configuration mistake, as a model no endpoint serves
        raise ValueError(f"no endpoint pinned to {pin.describe()} serves model {call.spec.model!r}")
    return pinned


def usable(call: CallBase, state: EndpointState) -> bool:
    """Whether an attempt may go to ``state`` now: admitted by the call's pin, not
    skipped by this call (its key out of quota, or too slow for the deadline),
    not ejected, breaker accepting."""
    pin = call.spec.pin
    if pin is not None and not pin.admits(state):
        return False
    if state.name in call._skipped:
        return False
    ejection, registry = call.core.ejection, call.core.breakers
    if ejection is not None and not ejection.usable(state):
        return False
    return registry is None or registry.get(state.name, call.spec.model).accepting


def _refusal(call: CallBase) -> CircuitOpenError:
    """The error of a call no endpoint can take: the soonest to return of the
    ejected endpoints and open breakers."""
    registry, ejection, model = call.core.breakers, call.core.ejection, call.spec.model
    if call.core.discovery is not None:
        call.core.discovery.request_refresh()  # every endpoint out: the set may be stale
    refusal: CircuitOpenError | None = None
    serving = _serving(call)
    for state in serving:
        wait = None if ejection is None else ejection.retry_in(state)
        if wait is not None:
            exc = CircuitOpenError(
                f"Endpoint {state.name} is ejected; it may return in {wait:.1f}s",
                breaker=state.name,
                retry_in=wait,
            )
        elif registry is not None:
            try:
                registry.get(state.name, model).before_call().ignore()
                continue  # it turned half-open meanwhile: the next attempt may go
            except CircuitOpenError as open_:
                exc = open_
        else:
            continue
        if refusal is None or (exc.retry_in or 0) < (refusal.retry_in or 0):
            refusal = exc
    if refusal is None:
        name = serving[0].name
        refusal = CircuitOpenError("Every endpoint was out of rotation", breaker=name)
    return refusal


def breaker_permit(call: CallBase, endpoint: EndpointState) -> Permit | None:
    registry = call.core.breakers
    if registry is None:
        return None
    return registry.get(endpoint.name, call.spec.model).before_call()


def any_endpoint_accepting(call: CallBase) -> bool:
    """Whether a retry could be sent now (some endpoint is in rotation with its
    breaker letting calls in)."""
    return any(usable(call, state) for state in _serving(call))


def can_retry_elsewhere(call: CallBase) -> bool:
    last = call._endpoint.name if call._endpoint is not None else call._last_endpoint
    return any(state.name != last and usable(call, state) for state in _serving(call))


def has_room_for(call: CallBase, target: EndpointState) -> bool:
    if call.core.picker.shedding(target):
        return False
    limiter = call.core.limiter
    return limiter is None or limiter.endpoint(target.name).state().paused_for <= 0


def own_endpoint(call: CallBase) -> str | None:
    """The endpoint the call's attempt is on (in flight, or chosen), else its last."""
    current = call._endpoint or call._endpoint_choice
    return current.name if current is not None else call._last_endpoint


def hedge_target(call: CallBase) -> EndpointState | None:
    """The endpoint of a hedge of ``call`` (``_call/hedge_race.py``): one that serves
    its model and class and is in rotation (not ejected, breaker accepting), not
    the one its own attempt is on, not shedding, not paused by its limiter, with a
    free concurrency slot (a hedge that queues is no faster); untried first, then
    by load (with ``LatencyRouting``, by load and latency), as a retry's. None: no
    endpoint can take it."""
    core = call.core
    own = own_endpoint(call)
    candidates, _ = core.picker.choose(
        model=call.spec.model,
        priority=call.priority,
        spill=core.spill_over,
        avoid=call._tried,
        usable=partial(usable, call),
        latency=core.latency_routing,
        stream=call.spec.stream,
    )
    limiter = core.limiter
    for state in candidates:
        if state.name == own or not has_room_for(call, state):
            continue
        if limiter is None or limiter.endpoint(state.name).has_room():
            return state
    return None
