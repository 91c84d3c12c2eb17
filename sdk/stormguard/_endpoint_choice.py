"""Which endpoint an attempt goes to: in rotation (not ejected, breaker
accepting), serving the call's model and class, untried first for a retry, a
free concurrency slot first; and the refusal when none can take it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._call_quota import CallPacing
from ._exceptions import CircuitOpenError

if TYPE_CHECKING:
    from ._breaker import Permit
    from ._endpoints import EndpointState


__all__ = ["EndpointChoice"]


class EndpointChoice(CallPacing):
    """The endpoint of each attempt."""

    def _pick_endpoint(self, *, retry: bool = False, untried_only: bool = False) -> EndpointState:
        """The endpoint of the next attempt. Endpoints that are ejected or whose
        breaker is open are skipped, and with none left the call fails now, with no
        I/O (``CircuitOpenError``). A retry goes to an endpoint the call has not
        tried when one is usable (only such one with ``untried_only``), else to
        another than the last; a requeue avoids the last. Of those, one with a free
        concurrency slot comes first, else the one with the shortest queue."""
        core = self.core
        if retry:
            avoid: set[str] = self._tried
        elif self.attempt_number > 0 and self._last_endpoint is not None:
            avoid = {self._last_endpoint}
        else:
            avoid = set()
        candidates = core.picker.candidates(
            model=self.spec.model,
            priority=self.priority,
            spill=core.spill_over,
            avoid=avoid,
            usable=self._usable,
        )
        if retry:
            untried = [s for s in candidates if s.name not in self._tried]
            candidates = untried if untried or untried_only else candidates
        if not candidates:
            raise self._refusal()
        limiter = core.limiter
        if limiter is None or len(candidates) == 1:
            return candidates[0]
        for state in candidates:
            if limiter.endpoint(state.name).has_room():
                return state
        # No free slot anywhere: wait in the own pool's shortest queue (another
        # pool's endpoints are spill-over, for room, never to queue on).
        own = [s for s in candidates if s.serves_class(self.priority)] or candidates
        return min(own, key=lambda s: limiter.endpoint(s.name).expected_wait())

    def _serving(self) -> list[EndpointState]:
        """The endpoints that serve the call's model and class now (spill-over included)."""
        return self.core.picker.serving(self.spec.model, self.priority, self.core.spill_over)

    def _usable(self, state: EndpointState) -> bool:
        """Whether an attempt may go to ``state`` now: not ejected, breaker accepting."""
        ejection, registry = self.core.ejection, self.core.breakers
        if ejection is not None and not ejection.usable(state):
            return False
        return registry is None or registry.get(state.name, self.spec.model).accepting

    def _refusal(self) -> CircuitOpenError:
        """The error of a call no endpoint can take: the soonest to return of the
        ejected endpoints and open breakers."""
        registry, ejection, model = self.core.breakers, self.core.ejection, self.spec.model
        if self.core.discovery is not None:
            self.core.discovery.request_refresh()  # every endpoint out: the set may be stale
        refusal: CircuitOpenError | None = None
        serving = self._serving()
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

    def _breaker_permit(self, endpoint: EndpointState) -> Permit | None:
        registry = self.core.breakers
        if registry is None:
            return None
        return registry.get(endpoint.name, self.spec.model).before_call()

    def any_endpoint_accepting(self) -> bool:
        """Whether a retry could be sent now (some endpoint is in rotation with its
        breaker letting calls in)."""
        return any(self._usable(state) for state in self._serving())

    def _can_retry_elsewhere(self) -> bool:
        last = self._endpoint.name if self._endpoint is not None else self._last_endpoint
        return any(state.name != last and self._usable(state) for state in self._serving())

    def _has_room_for(self, target: EndpointState) -> bool:
        if self.core.picker.shedding(target):
            return False
        limiter = self.core.limiter
        return limiter is None or limiter.endpoint(target.name).state().paused_for <= 0
